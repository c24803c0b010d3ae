"""Decode steps launched ahead (overlap scheduling): the GPU runs step n+1 while the host reads step n's tokens.

Sequences decoding from CUDA graphs otherwise make the GPU idle for the host's part of every step: the tokens' read,
the stop checks, the next step's scheduling, graph keys and launch. Here step n's tokens are picked on the GPU
(argmax into the graphs' input buffer, plus an asynchronous copy to pinned memory), so step n+1 is launched before
the host reads them, as vLLM's and SGLang's overlap schedulers do. The tokens are the synchronous loop's (the same
argmax of the same logits). When step n ends a sequence (EOS, a stop string, a finish the host alone decides), its
row of step n+1 was computed for nothing: the step is waited for, the row dropped with the sequence (its cache slot
and method state were its own), and the other rows' tokens kept, moved up in the input buffer to the order of the
smaller batch. Used only where nothing else can change what step n+1 is: every running sequence in the step,
nothing waiting, room for each next token without a preemption, greedy sampling without logprobs, penalties or a
grammar, no needle probe, and the next step one graph replay of them all (CUDA; on the CPU only under the tests'
graph stand-in).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infinitehip.engine.sequence import Sequence


@dataclass
class LaunchedStep:
    """A step whose tokens were picked on the GPU: the host reads them once `ready` has passed."""

    seqs: list[Sequence]  # in the order of the step's batch (rows of `token` and of the graphs' input buffer)
    token: torch.Tensor  # [N] int64 in pinned host memory, written by the GPU (CPU: the tokens themselves)
    ready: torch.cuda.Event | None  # None on the CPU (test graph runners), where every op has run already

    def read(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()  # waits for this step only, not for a step launched after it
        return self.token[: len(self.seqs)].tolist()


class DecodeAhead:
    """The engine's one step in flight (at most), and when a step may be launched ahead."""

    def __init__(self, scheduler, runner, enabled: bool):
        self.scheduler, self.runner, self.enabled = scheduler, runner, enabled
        self.pending: LaunchedStep | None = None
        self._slots: list[torch.Tensor] = []  # pinned [max rows]: the step being read and the one launched after it
        self._next_slot = 0

    def may_launch_after(self, seqs: list[Sequence]) -> bool:
        """Whether the step after the step in flight of `seqs` (their tokens not yet read) may be launched now."""
        s = self.scheduler
        if not (self.enabled and getattr(self.runner, "graph_decoder", None) is not None and seqs
                and len(s.running) == len(seqs) and not s.waiting):
            return False
        mine = {id(seq) for seq in seqs}
        return all(id(seq) in mine for seq in s.running) and all(self._greedy_decode(seq) for seq in seqs) \
            and s.decodes_fit(seqs)

    @staticmethod
    def _greedy_decode(seq: Sequence) -> bool:
        p = seq.params
        return (not seq.in_prefill and p.greedy and p.logprobs is None and p.repetition_penalty == 1.0
                and seq.grammar is None and seq.probe is None and len(seq.output_ids) + 1 < seq.max_tokens)

    def pick(self, seqs: list[Sequence], logits: torch.Tensor) -> LaunchedStep:
        """logits [N, vocab] of the step of `seqs` (rows in their order), on the GPU -> their greedy tokens, written
        into the graphs' input buffer (the next step reads them there) and copied to pinned memory without a sync."""
        tokens = torch.argmax(logits, dim=-1)  # [N]
        self.runner.graph_decoder.input_ids[: len(seqs)].copy_(tokens)
        if tokens.device.type != "cuda":
            return LaunchedStep(list(seqs), tokens.clone(), None)
        rows = self.runner.graph_decoder.input_ids.shape[0]
        if not self._slots:
            self._slots = [torch.empty(rows, dtype=torch.long, pin_memory=True) for _ in range(2)]
        host = self._slots[self._next_slot]
        self._next_slot ^= 1
        host[: len(seqs)].copy_(tokens, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return LaunchedStep(list(seqs), host, ready)

    def drop(self, seq: Sequence) -> None:
        """seq finishes or is aborted: a step of it still on the GPU is waited for (its graphs and pages go next);
        the step's other rows stay pending, their tokens moved up in the input buffer to the smaller batch's order."""
        pending = self.pending
        if pending is None or all(s is not seq for s in pending.seqs):
            return
        if pending.ready is not None:
            torch.cuda.current_stream().synchronize()
        keep = [i for i, s in enumerate(pending.seqs) if s is not seq]
        if not keep:
            self.pending = None
            return
        tokens = pending.token[keep].clone()  # host (pinned, the step has ended) or CPU tokens [N - 1]
        self.runner.graph_decoder.input_ids[: len(keep)].copy_(tokens)
        self.pending = LaunchedStep([pending.seqs[i] for i in keep], tokens, None)
