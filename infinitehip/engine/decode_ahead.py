"""Decode steps launched ahead (overlap scheduling): the GPU runs step n+1 while the host reads step n's token.

A lone sequence decoding from CUDA graphs otherwise makes the GPU idle for the host's part of every step: the token's
read, the stop checks, the next step's scheduling, graph key and launch. Here step n's token is picked on the GPU
(argmax into the graphs' input buffer, plus an asynchronous copy to pinned memory), so step n+1 is launched before the
host reads it, as vLLM's and SGLang's overlap schedulers do. The tokens are the synchronous loop's (the same argmax
of the same logits). When step n ends the sequence (EOS, a stop string, a finish the host alone decides), step n+1
was computed for nothing: it is waited for and dropped with the sequence (its cache slot and method state were the
sequence's own). Used only where nothing else can change what step n+1 is: one running sequence, nothing waiting,
room for the next token without a preemption, greedy sampling without logprobs, penalties or a grammar, no needle
probe, and the next step a graph replay (CUDA; on the CPU only under the tests' graph stand-in).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infinitehip.engine.sequence import Sequence


@dataclass
class LaunchedStep:
    """A step whose token was picked on the GPU: the host reads it once `ready` has passed."""

    seq: Sequence
    token: torch.Tensor  # [1] int64 in pinned host memory, written by the GPU (CPU: the token itself)
    ready: torch.cuda.Event | None  # None on the CPU (test graph runners), where every op has run already

    def read(self) -> int:
        if self.ready is not None:
            self.ready.synchronize()  # waits for this step only, not for a step launched after it
        return int(self.token[0])


class DecodeAhead:
    """The engine's one step in flight (at most), and when a step may be launched ahead."""

    def __init__(self, scheduler, runner, enabled: bool):
        self.scheduler, self.runner, self.enabled = scheduler, runner, enabled
        self.pending: LaunchedStep | None = None
        self._slots: list[torch.Tensor] = []  # pinned: the step being read and the one launched after it
        self._next_slot = 0

    def may_launch_after(self, seq: Sequence) -> bool:
        """Whether the step after seq's step in flight (its token not yet read) may be launched now."""
        p, s = seq.params, self.scheduler
        return (self.enabled and getattr(self.runner, "graph_decoder", None) is not None
                and len(s.running) == 1 and s.running[0] is seq and not s.waiting and not seq.in_prefill
                and p.greedy and p.logprobs is None and p.repetition_penalty == 1.0 and seq.grammar is None
                and seq.probe is None and len(seq.output_ids) + 1 < seq.max_tokens and s.decode_fits(seq))

    def pick(self, seq: Sequence, logits: torch.Tensor) -> LaunchedStep:
        """logits [1, vocab] of seq's step, on the GPU -> its greedy token, written into the graphs' input buffer (the
        next step reads it there) and copied to pinned memory without a host sync."""
        token = torch.argmax(logits[0]).view(1)
        self.runner.graph_decoder.input_ids.copy_(token)
        if token.device.type != "cuda":
            return LaunchedStep(seq, token.clone(), None)
        if not self._slots:
            self._slots = [torch.empty(1, dtype=torch.long, pin_memory=True) for _ in range(2)]
        host = self._slots[self._next_slot]
        self._next_slot ^= 1
        host.copy_(token, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return LaunchedStep(seq, host, ready)

    def drop(self, seq: Sequence) -> None:
        """seq finishes or is aborted: a step of it still on the GPU is waited for (its graphs and pages go next)."""
        if self.pending is not None and self.pending.seq is seq:
            if self.pending.ready is not None:
                torch.cuda.current_stream().synchronize()
            self.pending = None
