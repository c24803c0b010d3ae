"""Repeated prompt text left out of the pruning stages (`InfiniteHiPConfig.hierarchy_repeat_span`; not in the paper).

Why: the stages score keys position-free, so every copy of a passage scores alike, and a prompt holding a passage c
times (a document pasted twice, a corpus cycled to fill a context) made the answer attend it c times: c times the
attention mass of a fact that occurs once. At the prompt's last chunk and in decode, a stage-1 chunk whose every
token lies in a window of `hierarchy_repeat_span` tokens seen earlier in the prompt (attention/common/repeated_text.py) is
no candidate, so one copy of each passage stays selectable; text that never repeats is selected as without it.
The mask is made once per request, at the prompt's last chunk, and read by every decode step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infinitehip.attention.common.repeated_text import repeated_candidates


def novel_chunks(repeated: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """repeated [n] bool of candidates [sink, sink + n) -> [ceil(n / chunk_size)] bool: the chunk of the grid
    sink + chunk_size * j holds a token that repeats no earlier text."""
    n = -(-repeated.numel() // chunk_size)
    pad = n * chunk_size - repeated.numel()
    return ~F.pad(repeated, (0, pad), value=True).view(n, chunk_size).all(1)


def prompt_novel(seq, config, device: torch.device) -> torch.Tensor | None:
    """The prompt's stage-1 chunks holding text that repeats no earlier text [N] bool: made in the chunk that ends
    the prompt (seq.ends_prompt) by its first layer and kept in the method's state for decode; None when off
    (span 0), elsewhere, or without the prompt's ids (a transformers forward from inputs_embeds)."""
    if not seq.ends_prompt:
        return None
    state = seq.state
    if state.novel is None:
        repeated = repeated_candidates(seq.text, config.hierarchy_repeat_span, config.sink_tokens, seq.context_len,
                                       device)
        if repeated is None:
            return None
        state.novel, state.novel_by_width = novel_chunks(repeated, config.chunk_sizes[0]), {}
    return state.novel


def decode_novel(state, num_candidates: int) -> torch.Tensor | None:
    """state.novel cut or padded with True (chunks past the prompt) to a decode step's num_candidates stage-1 chunks
    -> [num_candidates] bool, one tensor per width (a captured graph keeps reading the one it saw)."""
    if state.novel is None:
        return None
    if num_candidates not in state.novel_by_width:
        cut = state.novel[:num_candidates]
        state.novel_by_width[num_candidates] = F.pad(cut, (0, num_candidates - cut.numel()), value=True)
    return state.novel_by_width[num_candidates]
