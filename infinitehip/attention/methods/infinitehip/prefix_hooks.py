"""InfiniteHiP's prefix-caching hooks (attention/capabilities.PrefixCaching): where a cached prefix is exact, and
the landmark saliency and question queries saved and restored at a prefix boundary. A mixin of
`InfiniteHiPAttention`: the hooks read its config and its saliency."""

from __future__ import annotations

import torch

from infinitehip.attention.capabilities import PrefixCaching
from infinitehip.attention.methods.infinitehip.state import InfiniteHiPState
from infinitehip.kv.prefix_reuse import PrefixReuse


class InfiniteHiPPrefixHooks(PrefixCaching):
    """The PrefixCaching hooks of InfiniteHiPAttention (which provides config and saliency)."""

    def prefix_reuse(self) -> PrefixReuse:
        """Prefill selection depends on the chunk (its context length; landmark saliency from the chunk's later
        queries): exact on the prefill-chunk grid only. Landmark saliency of a key changes until `landmark_window`
        later queries saw it: the keys of that window before the boundary are private copies, their sums restored
        from a snapshot taken at the boundary, with the last question_tokens queries before it (the vote of a prompt
        that leaves fewer after the boundary reads them: `auto`'s exact prompts; a pruned prompt's last
        `prompt_end_tokens` are never reused). The rest of the state (stage caches, question selection) is made after the boundary.
        Without landmark saliency there is no snapshot: the question's queries are recomputed instead."""
        if self.saliency is None:
            return PrefixReuse(chunk_aligned=True, min_recompute_tokens=max(1, self.config.question_tokens))
        return PrefixReuse(chunk_aligned=True, private_tail_tokens=self.config.landmark_window - 1)

    def prefix_snapshot(self, cache, slots: torch.Tensor, state: InfiniteHiPState | None = None):
        if self.saliency is None:
            return None
        out = {f"{kind}.{layer}": t for layer, (total, count) in self.saliency.snapshot(slots).items()
               for kind, t in (("sum", total), ("count", count))}
        for layer, q in enumerate(state.recent_q if state is not None else []):
            if q is not None:  # [<= question_tokens, H, d]: the queries a question after the boundary votes with
                out[f"recent_q.{layer}"] = q.to("cpu", copy=True)
        return out

    def restore_prefix(self, cache, slots: torch.Tensor, snapshot, state: InfiniteHiPState | None = None) -> None:
        if self.saliency is None or snapshot is None:
            return
        layers = sorted(int(name.split(".")[1]) for name in snapshot if name.startswith("sum."))
        self.saliency.restore(cache, slots, {layer: (snapshot[f"sum.{layer}"], snapshot[f"count.{layer}"])
                                             for layer in layers})
        if state is not None:
            for name, q in snapshot.items():
                if name.startswith("recent_q."):
                    state.recent_q[int(name.split(".")[1])] = q.to(cache.device)
