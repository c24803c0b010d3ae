"""Question-time selection (TokenSelect and InfiniteHiP): the prompt's last queries vote for the answer's keys.

Why: a decode query scores every candidate on its own, and in real prose a needle token has thousands of
look-alikes (every "X is Y" for the token after "is"); each competes for the same soft-vote mass, so beyond a
few thousand tokens the needle drops out of the top k (passkey hides this: its filler has no look-alikes).
The question's queries together match a needle *sentence* on several words at once. As SnapKV's observation
window does for KV eviction, their soft votes are summed; the sum is averaged over a centred window of
`window` tokens, so a span that matches several question words outranks isolated matches, then spread by a
max-pool of the same width, so the kept tokens are whole windows around the best centres (readable text,
not fragments). The result is fixed for the rest of the request: the answer is about that question.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from infinitehip.attention.common.needle_probe import FORCE_BONUS
from infinitehip.attention.ops.question_vote.op import summed_soft_vote
from infinitehip.model.rope import apply_rotary


def window_scores(votes: torch.Tensor, window: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """votes [N] fp32 -> [N]: the mean over a centred window (zeros past the ends), then its max over the same
    window, so every token of a top window scores that window's mean. valid [1] (a device count, votes past it 0):
    the scores of the first `valid` are those of votes[:valid] alone, the rest -inf."""
    past = None if valid is None else torch.arange(votes.numel(), device=votes.device) >= valid
    if window == 1:
        return votes if past is None else votes.masked_fill(past, float("-inf"))
    x = votes[None, None]
    mean = F.avg_pool1d(x, window, stride=1, padding=window // 2, count_include_pad=True)
    if past is not None:  # max_pool pads with -inf past the end: so must the means past the valid count
        mean = mean.masked_fill(past, float("-inf"))
    out = F.max_pool1d(mean, window, stride=1, padding=window // 2)[0, 0]
    return out if past is None else out.masked_fill(past, float("-inf"))


# (start, end) -> keys [end - start, Hkv, d] of token positions [start, end) of one sequence and layer, as cached
# (before RoPE): how an offloaded cache's keys are scanned (`OffloadedPagedCache.scan_k`), a segment at a time.
KeyReader = Callable[[int, int], torch.Tensor]
# fp32 logits of one segment, [n, H, segment]: bounds the scan's working memory (256 MiB).
SEGMENT_LOGITS = 1 << 26


def streamed_votes(q_rot: torch.Tensor, read_keys: KeyReader, start: int, count: int,
                   segment_logits: int = SEGMENT_LOGITS) -> torch.Tensor:
    """q_rot [n, H, d] rotated queries; candidates [start, start + count) read a segment at a time -> votes [count]
    fp32, the sum over queries and heads of each (query, head)'s softmax over all candidates (raw q . k), as
    `summed_soft_vote`. Two passes over the keys: the softmax of a (query, head) needs its log-sum-exp over
    every candidate before any vote is known, and the [n, H, count] logits do not fit at a million tokens."""
    n, H, d = q_rot.shape
    q = q_rot.float()
    segment = max(1, segment_logits // (n * H))

    def logits(a: int, b: int) -> torch.Tensor:
        k = read_keys(a, b).float()  # [S, Hkv, d]
        Hkv = k.shape[1]
        return torch.einsum("nkgd,skd->nkgs", q.view(n, Hkv, H // Hkv, d), k).reshape(n, H, b - a)

    spans = [(a, min(a + segment, start + count)) for a in range(start, start + count, segment)]
    lse = torch.full((n, H), float("-inf"), device=q.device)
    for a, b in spans:
        lse = torch.logaddexp(lse, logits(a, b).logsumexp(-1))
    votes = torch.empty(count, device=q.device)
    for a, b in spans:
        votes[a - start : b - start] = (logits(a, b) - lse[..., None]).exp().sum((0, 1))
    return votes


def question_scores(q: torch.Tensor, k_flat: torch.Tensor | None, page_table: torch.Tensor, page_size: int, sink: int,
                    limit: int, window: int, distance: int, rope, impl: str,
                    read_keys: KeyReader | None = None, reduce=None, repeated: torch.Tensor | None = None,
                    valid_limit: torch.Tensor | None = None) -> torch.Tensor:
    """q [n, H, d] pre-RoPE question queries; candidates [sink, limit) of one sequence -> window scores [limit - sink].

    Every query is rotated by `distance` and keys are read as cached (TokenSelect's position-free scoring); the
    per-head softmax runs on raw q . k (the TokenSelect paper's eq. 10), which on the embedded model's real-prose
    captures put more of the needle in the selection than the attention's 1/sqrt(d) scale (docs/real-text.md).
    Keys come from the paged cache (k_flat, page_table) or, for an offloaded cache, from `read_keys`.
    reduce(votes, "sum"): tensor parallelism, the votes of every rank's heads
    (`capabilities.TensorParallelHeads.reduce_heads`).
    repeated [limit - sink] bool (repeated_text.py): candidates whose text repeats earlier text get no vote, so the
    budget takes the first copy of a repeated passage only (its window scores, spread from the first copy, stay).
    valid_limit [1] (a device value <= limit, for a CUDA graph's static shapes; resident keys only): the candidates
    are [sink, valid_limit), scored as with limit = valid_limit; the rest of the bound scores -inf."""
    count = limit - sink
    valid = None if valid_limit is None else valid_limit - sink
    if valid is not None and read_keys is not None:
        raise ValueError("a device candidate count needs resident keys")
    rope.ensure(distance + 1)
    q_rot = apply_rotary(q.float(), rope.cos[distance], rope.sin[distance]).contiguous()
    reduce = reduce or (lambda votes, op: votes)
    if read_keys is not None:
        votes = reduce(streamed_votes(q_rot, read_keys, sink, count), "sum")
    else:
        votes = reduce(summed_soft_vote(q_rot, k_flat, page_table, page_size, sink, count, 1.0, impl=impl,
                                        valid=valid), "sum")
    if repeated is not None:
        votes = votes.masked_fill(repeated, 0.0)
    return window_scores(votes, window, valid)


def force_scores(scores: torch.Tensor, forced: torch.Tensor | None, sink: int, limit: int) -> torch.Tensor:
    """Oracle diagnostics (needle_probe.py): the forced tokens of [sink, limit) outrank every other candidate."""
    if forced is not None:
        f = forced[(forced >= sink) & (forced < limit)] - sink
        scores[f] = FORCE_BONUS
    return scores


def question_tokens(q: torch.Tensor, k_flat: torch.Tensor, page_table: torch.Tensor, page_size: int, sink: int,
                    limit: int, budget: int, window: int, distance: int, rope, impl: str,
                    forced: torch.Tensor | None = None, reduce=None,
                    repeated: torch.Tensor | None = None) -> torch.Tensor:
    """The question-time selection as sorted tokens [<= budget] of [sink, limit) (TokenSelect)."""
    if limit - sink <= budget:
        return torch.arange(sink, max(sink, limit), device=q.device)
    scores = question_scores(q, k_flat, page_table, page_size, sink, limit, window, distance, rope, impl,
                             reduce=reduce, repeated=repeated)
    scores = force_scores(scores, forced, sink, limit)
    return torch.topk(scores, budget).indices.sort().values + sink


def chunk_scores(scores: torch.Tensor, chunk_size: int, repeated: torch.Tensor | None = None) -> torch.Tensor:
    """Window scores [N] of candidates [sink, limit) -> [ceil(N / chunk_size)]: each grid chunk's best token; a chunk
    whose every token repeats earlier text (repeated [N]) -inf, so it is never kept."""
    total = -(-scores.numel() // chunk_size)
    tail = total * chunk_size - scores.numel()  # the last chunk's missing tokens
    best = F.pad(scores, (0, tail), value=float("-inf")).view(total, chunk_size).amax(1)
    if repeated is not None:
        best = best.masked_fill(F.pad(repeated, (0, tail), value=True).view(total, chunk_size).all(1), float("-inf"))
    return best


def chunk_rank(best: torch.Tensor, tokens: torch.Tensor, sink: int, chunk_size: int) -> int | None:
    """Diagnostics (needle_probe.py): the 0-based rank among chunk scores best [C] of the best chunk holding any
    of tokens [n] (positions), i.e. the smallest question budget in chunks that would have kept it; None when no
    watched token is a candidate."""
    idx = (tokens[(tokens >= sink) & (tokens < sink + chunk_size * best.numel())] - sink) // chunk_size
    if idx.numel() == 0:
        return None
    return int((best > best[idx].max()).sum())


def question_chunks(q: torch.Tensor, k_flat: torch.Tensor | None, page_table: torch.Tensor, page_size: int, sink: int,
                    limit: int, num_chunks: int, chunk_size: int, window: int, distance: int, rope, impl: str,
                    forced: torch.Tensor | None = None,
                    read_keys: KeyReader | None = None, reduce=None,
                    repeated: torch.Tensor | None = None,
                    valid_limit: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The question-time selection as num_chunks chunks of the grid sink + chunk_size * j (InfiniteHiP's final
    stage grid), each scored by its best token -> (starts [num_chunks], lens [num_chunks]) in position order,
    unused entries last with length 0. repeated (question_scores): a chunk whose every token repeats earlier text is
    never kept, so repetitive text (a passkey's filler) leaves budget unused rather than fill it with copies.
    valid_limit (question_scores): limit is a host bound, the candidates end at this device value; no host sync.
    The same chunks as with limit = valid_limit where that leaves more than num_chunks of them (the caller's
    check): past it every chunk scores -inf."""
    device = q.device
    total = max(0, -(-(limit - sink) // chunk_size))
    kept = None
    if total <= num_chunks:
        idx = torch.arange(total, device=device)
    else:
        scores = question_scores(q, k_flat, page_table, page_size, sink, limit, window, distance, rope, impl,
                                 read_keys, reduce, repeated, valid_limit)
        scores = force_scores(scores, forced, sink, limit)
        best = chunk_scores(scores, chunk_size, repeated)
        top = torch.topk(best, num_chunks)
        # kept chunks in position order, left-out ones (-inf: repeated) after them
        order = torch.where(top.values > float("-inf"), top.indices, total).argsort()
        idx, kept = top.indices[order], (top.values > float("-inf"))[order]
    starts = sink + chunk_size * idx
    lens = ((limit if valid_limit is None else valid_limit) - starts).clamp(min=0, max=chunk_size)
    if kept is not None:  # all True unless repeated text was left out
        lens = torch.where(kept, lens, 0)
    starts = torch.where(lens > 0, starts, 0)
    pad = num_chunks - idx.numel()
    return F.pad(starts, (0, pad)), F.pad(lens, (0, pad))
