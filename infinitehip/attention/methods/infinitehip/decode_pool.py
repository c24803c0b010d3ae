"""Per-sequence decode state pooled across sequences, so a decode batch's sequences are rows of one tensor and each of
the step's small ops launches once for the batch instead of once per sequence (decode_batch.py).

A sequence takes one row of a pool at its first decode step and keeps it until `release`. A pool's tensors (per name
and layer, [rows, ...]) are allocated once at a fixed row count and never reallocated: CUDA graphs hold their
pointers. When every row is taken a new pool opens with as many rows as all the earlier ones together, so the total
doubles; sequences of different pools (only after more sequences decoded at once than the first pool holds) run the
batched ops once per pool.

Index tensors [B] of host-known rows or batch positions are built once (`device_tensor`, by the eager step that a
graph capture follows, so a capture copies nothing from the host) and kept: a captured graph reads them. Row sets go
when one of their rows is released (every graph holding them held that row's sequence, and goes with it); batch
position sets are subsets of the engine's batch rows, few.
"""

from __future__ import annotations

import torch

from infinitehip.host_values import device_tensor


class Pool:
    """`rows` rows of pooled decode state; tensors made on first use per (name, layer)."""

    def __init__(self, index: int, rows: int):
        self.index, self.rows = index, rows
        self.free = list(range(rows - 1, -1, -1))  # the lowest row first: a batch's rows tend to be in order
        self._tensors: dict[tuple[str, int], torch.Tensor] = {}

    def tensor(self, name: str, layer: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
               fill: float = 0) -> torch.Tensor:
        """[rows, *shape] of `name` for `layer`, made (filled with `fill`) the first time it is asked for."""
        t = self._tensors.get((name, layer))
        if t is None:
            t = self._tensors[name, layer] = torch.full((self.rows, *shape), fill, dtype=dtype, device=device)
        return t


class DecodePools:
    """Every pool of one method instance, and the index tensors of the row and batch-position sets its batches use."""

    def __init__(self, first_rows: int = 16):  # the engine's default max_num_seqs: one pool for a default batch
        self.first_rows = first_rows
        self.pools: list[Pool] = []
        self._indices: dict[tuple, torch.Tensor] = {}

    def assign(self) -> tuple[Pool, int]:
        """A free (pool, row), opening a pool when every row is taken."""
        for pool in self.pools:
            if pool.free:
                return pool, pool.free.pop()
        pool = Pool(len(self.pools), sum(p.rows for p in self.pools) or self.first_rows)
        self.pools.append(pool)
        return pool, pool.free.pop()

    def row_of(self, state) -> tuple[Pool, int]:
        """A sequence's (pool, row) (state.pool_row, InfiniteHiPState), taken at its first decode step."""
        if state.pool_row is None:
            state.pool_row = self.assign()
        return state.pool_row

    def groups(self, states: list) -> list[tuple[Pool, list[int]]]:
        """The batch positions of the sequences (their states, rows taken) of each pool, pools in first-seen order."""
        groups: dict[int, tuple[Pool, list[int]]] = {}
        for i, state in enumerate(states):
            groups.setdefault(state.pool_row[0].index, (state.pool_row[0], []))[1].append(i)
        return list(groups.values())

    def release(self, pool: Pool, row: int) -> None:
        pool.free.append(row)
        for key in [k for k in self._indices if k[0] == pool.index and row in k[1]]:
            del self._indices[key]

    def rows(self, pool: Pool, rows: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """[B] int64 rows of `pool` (kept until one of them is released)."""
        return self._index((pool.index, rows), device)

    def positions(self, positions: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """[B] int64 positions in a decode batch (kept)."""
        return self._index((-1, positions), device)

    def take(self, t: torch.Tensor, positions: tuple[int, ...]) -> torch.Tensor:
        """Rows `positions` of t (a batch's rows): a view when they are consecutive, else one gather."""
        return _take(t, positions, lambda: self.positions(positions, t.device))

    def take_rows(self, t: torch.Tensor, pool: Pool, rows: tuple[int, ...]) -> torch.Tensor:
        """Rows `rows` of a pool's tensor t: a view when they are consecutive, else one gather."""
        return _take(t, rows, lambda: self.rows(pool, rows, t.device))

    def _index(self, key: tuple, device: torch.device) -> torch.Tensor:
        t = self._indices.get(key)
        if t is None:
            t = self._indices[key] = device_tensor(list(key[1]), torch.long, device)
        return t


def _take(t: torch.Tensor, values: tuple[int, ...], index) -> torch.Tensor:
    if all(v == values[0] + i for i, v in enumerate(values)):
        return t[values[0] : values[0] + len(values)]
    return t.index_select(0, index())
