"""Needle probe: watch given prompt tokens (a needle) through a method's selections, or force them in (oracle).

A diagnostic, never on by default. It separates the two ways a long-context answer is lost: the method did not
select the tokens that hold the answer (a selection miss), or it selected them and the model still answered
wrongly (a reading miss). The engine attaches one probe to a request (`LLM.chat(..., needle_tokens=...,
oracle=...)`); methods that select keys report what share of the watched tokens each selection keeps:

- prefill: for the block holding the prompt's last query (the question), per layer, after each pruning stage
  (`stage0`, `stage1`, ...) and for the keys finally attended (`attended`);
- decode: per step and layer, the share of watched tokens among the keys the step attends.

A watched token counts as kept when it is attended whatever the selection does (sink, local/stream window).
With `oracle=True` the methods rank the watched tokens (or the chunks holding them) above every other
candidate, so they take budget slots of every layer's selection: the upper bound of the method's selection
with the model's reading unchanged. Recording reads device values on the host: slow, for diagnostics only
(CUDA-graph decode is off for a probed request).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Added to a watched candidate's score so it outranks every other one (finite: top-k and sorts stay exact).
FORCE_BONUS = 1e30


@dataclass(eq=False)
class NeedleProbe:
    tokens: tuple[int, ...]  # watched prompt positions (cache slots of a method that never compacts its cache)
    oracle: bool = False
    prompt_tokens: int = 0  # set by the engine: the prompt's length, so a method knows its last prefill chunk
    prefill: dict[str, list[float | None]] = field(default_factory=dict)  # name -> [num_layers]
    decode: dict[int, list[float]] = field(default_factory=dict)  # layer -> share per decode step
    _on_device: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.tokens = tuple(sorted({int(t) for t in self.tokens}))
        if not self.tokens:
            raise ValueError("a needle probe needs at least one token position")
        if self.tokens[0] < 0:
            raise ValueError(f"needle token positions must be >= 0, got {self.tokens[0]}")

    def on(self, device: torch.device) -> torch.Tensor:
        """The watched positions as a sorted int64 tensor [n] on `device` (copied once per device)."""
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = torch.tensor(self.tokens, dtype=torch.int64, device=device)
        return self._on_device[key]

    def is_last_prefill(self, context_len: int) -> bool:
        """This prefill chunk ends the prompt (its last block holds the question)."""
        return context_len == self.prompt_tokens

    # ---- shares -------------------------------------------------------------------------------------------
    def share_of_tokens(self, key_tokens: torch.Tensor) -> float:
        """Share of watched tokens among key_tokens [K] (a key list; padding may repeat token 0)."""
        needle = self.on(key_tokens.device)
        return float(torch.isin(needle, key_tokens.long()).float().mean())

    def share_of_chunks(self, starts: torch.Tensor, lens: torch.Tensor, sink: int, limit: int) -> float:
        """Share of watched tokens inside chunks starts/lens [C], or attended anyway (below `sink`, from `limit`)."""
        needle = self.on(starts.device)
        inside = (needle[:, None] >= starts[None]) & (needle[:, None] < (starts + lens)[None])
        kept = inside.any(1) | (needle < sink) | (needle >= limit)
        return float(kept.float().mean())

    # ---- records ------------------------------------------------------------------------------------------
    def record_prefill(self, name: str, layer: int, num_layers: int, share: float) -> None:
        self.prefill.setdefault(name, [None] * num_layers)[layer] = share

    def record_decode(self, layer: int, share: float) -> None:
        self.decode.setdefault(layer, []).append(share)

    def summary(self) -> dict:
        """Plain numbers for a results file: per-layer prefill shares, per-step decode shares (mean and min over
        layers) and the mean over everything decoded."""
        steps = max((len(v) for v in self.decode.values()), default=0)
        per_step_mean, per_step_min = [], []
        for i in range(steps):
            vals = [v[i] for v in self.decode.values() if i < len(v)]
            per_step_mean.append(sum(vals) / len(vals))
            per_step_min.append(min(vals))
        prefill_mean = {name: _mean(vals) for name, vals in self.prefill.items()}
        return {
            "needle_tokens": len(self.tokens),
            "oracle": self.oracle,
            "prefill": {name: list(vals) for name, vals in self.prefill.items()},
            "prefill_mean": prefill_mean,
            "decode_step_mean": per_step_mean,
            "decode_step_min": per_step_min,
            "decode_mean": _mean(per_step_mean),
        }


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None
