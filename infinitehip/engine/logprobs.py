"""Log-probabilities the API returns: of each sampled token (with the top alternatives) and of the prompt's tokens.

Both are the model's own distribution at that position (log-softmax of the raw logits, before temperature, top-k or
top-p), as OpenAI and vLLM report them. With a sparse attention method the logits are that method's, so they are
its own approximation of the model's (dense gives the model's exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the `top` most likely tokens at this position, most likely first


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, top: int) -> list[TokenLogprob]:
    """logits [n, vocab], targets [n] -> each target's log-probability with the `top` most likely tokens."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, targets[:, None].long())[:, 0].tolist()
    if top > 0:
        values, ids = logp.topk(top, dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [()] * len(chosen)
    return [TokenLogprob(int(t), lp, tp) for t, lp, tp in zip(targets.tolist(), chosen, tops)]


def prompt_logprobs(compute_logits, hidden: torch.Tensor, targets: torch.Tensor, top: int,
                    rows_per_pass: int = 512) -> list[TokenLogprob]:
    """hidden [n, D] of prompt positions whose next tokens are targets [n] -> their log-probabilities, computed
    rows_per_pass at a time (the logits of a whole prefill chunk would take n x vocab floats)."""
    out: list[TokenLogprob] = []
    for i in range(0, hidden.shape[0], rows_per_pass):
        out += token_logprobs(compute_logits(hidden[i : i + rows_per_pass]), targets[i : i + rows_per_pass], top)
    return out
