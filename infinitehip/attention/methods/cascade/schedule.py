"""The cascade's acceptance schedule and the positions of its slots: host bookkeeping shared by every layer and head.

Slots of a sequence: [0, S) sinks; sub-cache i in [S + i W, S + (i + 1) W), a circular buffer; then the stride.
Token t of the stream (the t-th token pushed, sinks excluded) enters sub-cache 0, which always accepts; a token
evicted from sub-cache i - 1 arrives at sub-cache i, and

1. sub-cache i not full: it takes the token in its next empty slot (nothing is evicted);
2. full and accepting (t a multiple of 2^i): the token replaces its oldest, which moves on to sub-cache i + 1
   (is dropped after the last one);
3. full, not accepting, the token's score below that of the sub-cache's newest: the token is dropped;
4. full, not accepting, the token's score at least the newest's: the token replaces the newest, which is dropped.

Once every sub-cache is full, a token arrives at sub-cache i at multiples of 2^(i-1) only, so it accepts every
second one: "half of the tokens evicted from the previous cache" (blog post), every 2^i-th of the stream. Which
slots take part in each push depends on the counts only, never on scores, so the host lays the pushes out as a
plan (`plan_pushes`): per push and sub-cache, an op (FILL, PASS, COMPARE or NONE) and a slot. Where case 3 or 4
applies (COMPARE) is decided per layer and KV head by the update (update/).

Positions: tokens stay in the order they arrived (a sub-cache holds older tokens than the one before it, and a
circular buffer is ordered from its oldest slot), so a key's position is its rank in the cache: sinks 0..S-1, the
oldest sub-cache's tokens next, sub-cache 0's newest last, then the stride at its slots.

Filling: sub-cache i fills only once i - 1 is full and then takes every 2^(i-1)-th push (its first at the next
multiple of 2^(i-1)), so the cache is full after 2^(C-1) W - 2^(C-2) + 1 pushes (C > 1; W with one sub-cache),
mostly longer than the first push (C W + stride): 4 sub-caches of 4,080 and a 1,024 stride fill after 32,637
pushes, the first push is 17,344 (with 3 sub-caches of 16 and a stride of 24 the first push fills them). Until then
a sub-cache's slots past its count hold no token of it (what a prompt chunk wrote there before the first push):
`held_slots` lists the slots that hold one, the only ones attended.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

NONE, FILL, PASS, COMPARE = 0, 1, 2, 3


@dataclass
class CascadeSchedule:
    sinks: int
    subcaches: int
    width: int  # W, slots per sub-cache
    pushed: int = 0  # tokens pushed into sub-cache 0 so far
    counts: list[int] = field(default_factory=list)  # tokens in each sub-cache
    heads: list[int] = field(default_factory=list)  # each full sub-cache's oldest slot (its next write), 0..W-1

    def __post_init__(self) -> None:
        self.counts = self.counts or [0] * self.subcaches
        self.heads = self.heads or [0] * self.subcaches

    @property
    def kept(self) -> int:
        return self.sinks + self.subcaches * self.width

    @property
    def full(self) -> bool:
        return self.counts[-1] == self.width  # sub-caches fill in order: the last one fills last

    def plan_pushes(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Push n tokens (advancing the schedule) -> ops [n, C] int32 and slots [n, C] int32 (sequence slots)."""
        C = self.subcaches
        ops = torch.zeros(n, C, dtype=torch.int32)
        slots = torch.zeros(n, C, dtype=torch.int32)
        rows: list[tuple[list[int], list[int]]] = []  # filling: at most C * W pushes in a sequence's life
        while len(rows) < n and not self.full:
            rows.append(self._plan_one())
        if rows:
            ops[: len(rows)] = torch.tensor([r[0] for r in rows], dtype=torch.int32)
            slots[: len(rows)] = torch.tensor([r[1] for r in rows], dtype=torch.int32)
        if len(rows) < n:
            self._plan_full(ops[len(rows) :], slots[len(rows) :])
        return ops, slots

    def _plan_one(self) -> tuple[list[int], list[int]]:
        """One push while some sub-cache is not full -> its (ops [C], slots [C])."""
        t, W = self.pushed, self.width
        ops, slots = [NONE] * self.subcaches, [0] * self.subcaches
        for i in range(self.subcaches):
            base = self.sinks + i * W
            if self.counts[i] < W:
                ops[i], slots[i] = FILL, base + self.counts[i]
                self.counts[i] += 1
                break
            if t % (1 << i) == 0:
                ops[i], slots[i] = PASS, base + self.heads[i]
                self.heads[i] = (self.heads[i] + 1) % W
                continue
            ops[i], slots[i] = COMPARE, base + (self.heads[i] - 1) % W
            break
        self.pushed += 1
        return ops, slots

    def _plan_full(self, ops: torch.Tensor, slots: torch.Tensor) -> None:
        """Every sub-cache full: push t passes on through sub-caches 0..z (2^i divides t for i <= z) and compares
        at sub-cache z + 1; per sub-cache the passes walk its buffer from its head."""
        n, C, W = ops.shape[0], self.subcaches, self.width
        t = torch.arange(self.pushed, self.pushed + n, dtype=torch.long)
        level = torch.arange(C, dtype=torch.long)
        passes = (t[:, None] % (2 ** level)[None, :]) == 0  # [n, C]: 2^i divides t (i = 0 always)
        passes = passes.long().cumprod(1).bool()  # a pass needs every pass before it
        depth = passes.sum(1)  # sub-caches passed through
        compares = level[None, :] == depth[:, None]
        # Passes of sub-cache i before push t, plus its own: its slot is the head as the earlier passes left it
        # (a pass writes there), and a compare's slot the one before that head (the newest).
        walked = passes.long().cumsum(0) - 1
        heads = torch.tensor(self.heads, dtype=torch.long)
        slot = self.sinks + level[None, :] * W + (heads[None, :] + walked) % W
        ops.copy_(torch.where(passes, PASS, torch.where(compares, COMPARE, NONE)))
        slots.copy_(torch.where(passes | compares, slot, 0))
        total = passes.long().sum(0)
        self.heads = [int(h) for h in (heads + total) % W]
        self.pushed += n

    def held_slots(self) -> torch.Tensor | None:
        """[held] int64, ascending: the kept slots holding a token (sinks, each sub-cache's first counts[i]); None
        when every kept slot does (the cache is full, or nothing was pushed: the slots are the prompt's tokens)."""
        if self.pushed == 0 or self.full:
            return None
        S, W = self.sinks, self.width
        parts = [torch.arange(S, dtype=torch.long)]
        parts += [torch.arange(S + i * W, S + i * W + c, dtype=torch.long) for i, c in enumerate(self.counts)]
        return torch.cat(parts)

    def positions(self) -> torch.Tensor:
        """[kept] int64: the position of each kept slot (sinks, then the sub-caches by age, each oldest first); a
        slot that holds no token (`held_slots`) gets a position too, never attended."""
        S, W = self.sinks, self.width
        pos = torch.arange(self.kept, dtype=torch.long)
        if self.pushed == 0:
            return pos
        j = torch.arange(W, dtype=torch.long)
        older = 0  # tokens in the sub-caches older than sub-cache i
        for i in reversed(range(self.subcaches)):
            rank = (j - self.heads[i]) % W if self.counts[i] == W else j
            pos[S + i * W : S + (i + 1) * W] = S + older + rank
            older += self.counts[i]
        return pos
