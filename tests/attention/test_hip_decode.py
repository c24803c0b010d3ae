"""HiP v1's sync-free decode (`attention/methods/hip/method.py`, `key_list.py`, `state.py`): against the eager decode
it replaced (kept below as the reference: per-sequence masks, key lists sliced to their data-dependent widths,
dense SDPA when no sequence selects), over several context lengths, refresh intervals and phases, one sequence and a
batch; the hierarchy's fixed pass count; and no value read back to the host during a decode step."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.attention.methods.hip.config import HiPConfig, candidate_end
from infinitehip.attention.methods.hip.hierarchy import hierarchy_rounds, select_blocks
from infinitehip.attention.methods.hip.method import HiPAttention
from infinitehip.attention.ops.sparse.op import sparse_attention_decode
from infinitehip.config.model import ModelConfig
from infinitehip.kv.paged_cache import PagedKVCache
from infinitehip.model.rope import RotaryEmbedding, apply_rotary

H, HKV, D, PAGE = 4, 2, 16, 8
_BIG = torch.iinfo(torch.int64).max


# ---- the eager decode before it was made sync-free (the reference) -----------------------------------------
@dataclass
class _Mask:
    starts: torch.Tensor | None
    lens: torch.Tensor | None
    end: int


def _old_key_list(starts, lens, ends, last, sink, block_size, width):
    device = ends.device
    e = last[:, None]
    if starts is None:
        starts = torch.zeros(ends.shape[0], 0, dtype=torch.long, device=device)
        lens = starts
    dense = (lens.sum(1) == 0)[:, None]
    sink_tok = torch.arange(sink, device=device)[None, :].expand(ends.shape[0], -1)
    offsets = torch.arange(block_size, device=device)
    sel_tok = (starts[:, :, None] + offsets).flatten(1)
    sel_ok = (offsets < lens[:, :, None]).flatten(1)
    win_tok = ends[:, None] + torch.arange(width, device=device)
    sparse_tok = torch.cat([sink_tok, sel_tok, win_tok], 1)
    sparse_ok = torch.cat([sink_tok <= e, sel_ok, win_tok <= e], 1)
    span = int(last.max()) + 1 if bool(dense.any()) else 0
    all_tok = torch.arange(span, device=device)[None, :].expand(ends.shape[0], -1)
    W = max(sparse_tok.shape[1], span)
    sparse_tok = F.pad(sparse_tok, (0, W - sparse_tok.shape[1]))
    sparse_ok = F.pad(sparse_ok, (0, W - sparse_ok.shape[1]))
    all_tok = F.pad(all_tok, (0, W - span))
    all_ok = F.pad(all_tok[:, :span] <= e, (0, W - span))
    tokens = torch.where(dense, all_tok, sparse_tok)
    ok = torch.where(dense, all_ok, sparse_ok)
    tokens = torch.where(ok, tokens, _BIG).sort(dim=1).values
    counts = ok.sum(1)
    tokens = tokens[:, : int(counts.max())]
    return torch.where(tokens == _BIG, 0, tokens), counts


class OldDecode:
    """The previous HiPAttention.decode, with its own per-sequence masks and step counters (keyed by seq_id)."""

    def __init__(self, method: HiPAttention):
        self.m, self.masks, self.steps = method, {}, {}

    def _refresh(self, layer, q, seq, batch):
        c = self.m.config
        position = seq.start_pos
        end = candidate_end(position, c)
        if not c.selects(position):
            return _Mask(None, None, end)
        pos = torch.tensor([position])
        q_rot = apply_rotary(q.float(), batch.rope.cos[pos][:, None], batch.rope.sin[pos][:, None])
        starts, lens = self.m._select(q_rot[None], seq.cache, layer, seq.page_table, batch.rope,
                                      torch.tensor([end]))
        return _Mask(starts[0], lens[0], end)

    def decode(self, layer, q, seqs, batch):
        c = self.m.config
        if layer < c.dense_layers:
            return torch.cat([self.m._dense(layer, q[i : i + 1], s, batch) for i, s in enumerate(seqs)])
        masks = []
        for i, seq in enumerate(seqs):
            key = (seq.seq_id, layer)
            step = self.steps.get(key, 0)
            if key not in self.masks or step % c.refresh_interval == 0:
                self.masks[key] = self._refresh(layer, q[i : i + 1], seq, batch)
            self.steps[key] = step + 1
            masks.append(self.masks[key])
        if all(m.starts is None for m in masks):
            return torch.cat([self.m._dense(layer, q[i : i + 1], s, batch) for i, s in enumerate(seqs)])
        none = torch.zeros(c.top_k_blocks, dtype=torch.long)
        starts = torch.stack([none if m.starts is None else m.starts for m in masks])
        lens = torch.stack([none if m.lens is None else m.lens for m in masks])
        ends = torch.tensor([m.end for m in masks])
        last = torch.tensor([s.start_pos for s in seqs])
        width = int((last - ends).max()) + 1
        tokens, counts = _old_key_list(starts, lens, ends, last, c.sink_tokens, c.key_block_size, width)
        tokens, counts = tokens.int(), counts.int()
        return sparse_attention_decode(q, seqs[0].cache.flat_k(layer), seqs[0].cache.flat_v(layer),
                                       batch.decode_page_tables, seqs[0].cache.page_size, tokens, counts, tokens,
                                       last.int(), batch.rope.cos, batch.rope.sin, self.m.sm_scale,
                                       impl=self.m._impl(q))


# ---- harness: several sequences in one shuffled paged cache ---------------------------------------------------
class Sequences:
    def __init__(self, config: HiPConfig, max_len: int, count: int, layers: int = 3, seed: int = 0):
        self.mc = ModelConfig(model_type="llama", vocab_size=16, hidden_size=64, intermediate_size=64,
                              num_layers=layers, num_heads=H, num_kv_heads=HKV, head_dim=D, rms_norm_eps=1e-5,
                              rope_theta=10000.0, max_position_embeddings=8192)
        self.gen = torch.Generator().manual_seed(seed)
        per_seq = -(-max_len // PAGE)
        pages = per_seq * count
        self.cache = PagedKVCache(layers, pages, PAGE, HKV, D, torch.float32, "cpu")
        self.cache.k.copy_(torch.randn(self.cache.k.shape, generator=self.gen))
        self.cache.v.copy_(torch.randn(self.cache.v.shape, generator=self.gen))
        perm = torch.randperm(pages, generator=self.gen).int()
        self.tables = [perm[i * per_seq : (i + 1) * per_seq] for i in range(count)]
        self.rope = RotaryEmbedding(self.mc, max_len + 8)
        self.method = HiPAttention(self.mc, config)
        self.old = OldDecode(self.method)
        self.states = [self.method.new_state() for _ in range(count)]

    def batch(self, ids: list[int], positions: list[int]) -> tuple[list[SequenceSlice], ForwardBatch]:
        seqs = [SequenceSlice(i, row, 1, p, p, self.tables[i], self.cache, self.states[i], False)
                for row, (i, p) in enumerate(zip(ids, positions))]
        return seqs, ForwardBatch(seqs, self.cache, self.rope, len(seqs))

    def step(self, ids: list[int], positions: list[int], impl: str) -> None:
        """One decode step of the sequences `ids` at `positions` through every layer: new == old."""
        for layer in range(self.mc.num_layers):
            q = torch.randn(len(ids), H, D, generator=self.gen)
            seqs, batch = self.batch(ids, positions)
            new = self.method.decode(layer, q, seqs, batch)
            seqs, batch = self.batch(ids, positions)
            old = self.old.decode(layer, q, seqs, batch)
            dense_step = layer < self.method.config.dense_layers or not any(self.states[i].sparse[layer] for i in ids)
            if impl == "reference" and not dense_step:  # the same key lists through the same op
                assert torch.equal(new, old), (layer, positions)
            else:  # dense's paged op where the old decode ran SDPA; the CPU op over padded lists
                torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-6)


SMALL = dict(top_k_tokens=8, key_block_size=2, query_block_size=4, sink_tokens=4, window_tokens=16, dense_layers=1)
THRESHOLD = 4 + 16 + 2 * 8 - 1  # first position whose candidates select


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("refresh", [1, 3, 8])
@pytest.mark.parametrize("start", [THRESHOLD - 5, 100, 333])
def test_one_sequence_decodes_what_the_eager_decode_did(impl, refresh, start):
    """Decode steps across refreshes (and, from THRESHOLD - 5, from dense to selecting): the same attention."""
    steps = 2 * refresh + 3
    seqs = Sequences(HiPConfig(**SMALL, refresh_interval=refresh, impl=impl), start + steps + 1, 1)
    for t in range(steps):
        seqs.step([0], [start + t], impl)
    assert seqs.states[0].refreshes[1] == -(-steps // refresh)


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("refresh", [1, 4])
def test_a_batch_in_different_refresh_phases_decodes_what_the_eager_decode_did(impl, refresh):
    """Three sequences of different lengths (one dense, crossing into selection) joining at different steps, so
    their refreshes fall on different steps; one leaves early."""
    starts, joins, leaves = [THRESHOLD - 3, 150, 400], [0, 1, 3], [14, 11, 14]
    seqs = Sequences(HiPConfig(**SMALL, refresh_interval=refresh, impl=impl), 420, 3, seed=1)
    for t in range(14):
        ids = [i for i in range(3) if joins[i] <= t < leaves[i]]
        seqs.step(ids, [starts[i] + t - joins[i] for i in ids], impl)
    phases = {seqs.states[i].decode_steps[1] % refresh for i in range(3)}
    assert refresh == 1 or len(phases) > 1


@pytest.mark.parametrize("seed", [0, 1])
def test_the_hierarchy_with_a_fixed_pass_count_selects_what_it_selects_reading_back(seed):
    """Rows far shorter than the bound the passes are counted for: the extra passes keep the selection."""
    seqs = Sequences(HiPConfig(**SMALL), 900, 1, seed=seed)
    ends = torch.tensor([36, 37, 70, 251, 600, 880])
    q = torch.randn(6, 3, H, D, generator=seqs.gen)
    args = (seqs.cache.flat_k(1), seqs.tables[0], PAGE, seqs.rope.cos, seqs.rope.sin, ends, 4, 4, 2)
    want = select_blocks(q, *args)
    for bound in (880, 4096):
        got = select_blocks(q, *args, rounds=hierarchy_rounds(bound, 4, 4, 2))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert hierarchy_rounds(4 + 16, 4, 4, 2) == 1 and hierarchy_rounds(4 + 32, 4, 4, 2) == 2


def test_a_decode_step_reads_nothing_back_to_the_host(monkeypatch):
    """Every host read a tensor offers raises during decode steps (refreshing and not, batch with a dense row):
    the step is CUDA-graph capturable."""
    seqs = Sequences(HiPConfig(**SMALL, refresh_interval=2), 300, 2)
    for t in range(2):  # eager first steps allocate the kept selections
        seqs.step([0, 1], [THRESHOLD - 2 + t, 250 + t], "auto")

    def refuse(*args, **kwargs):
        raise AssertionError("host read inside a decode step")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    for t in range(2, 6):
        positions = [THRESHOLD - 2 + t, 250 + t]
        for layer in range(seqs.mc.num_layers):
            q = torch.randn(2, H, D, generator=seqs.gen)
            batch = seqs.batch([0, 1], positions)[1]
            batch.__dict__["decode_positions"] = torch.tensor(positions)  # as a graph's static buffer
            batch.__dict__["decode_page_tables"] = torch.stack(seqs.tables)
            batch.__dict__["decode_capacity"] = seqs.tables[0].numel() * PAGE
            seqs.method.decode(layer, q, batch.decode, batch)
    monkeypatch.undo()
    assert seqs.states[0].refreshes[1] == 3


# ---- through the engine: graphs replay what eager decodes ------------------------------------------------------
ENGINE_HIP = HiPConfig(top_k_tokens=16, key_block_size=2, query_block_size=8, sink_tokens=4, window_tokens=16,
                       refresh_interval=4, dense_layers=1)  # selects from position 4 + 16 + 32 - 1 = 51


@pytest.mark.parametrize("prompt,tokens", [(40, 24), (300, 14)])
def test_engine_greedy_tokens_from_graphs_equal_eager_ones(tiny_llama_dir, prompt, tokens):
    """One sequence (CUDA-graph semantics on CPU): from a prompt too short to select into selection (40), and
    past it (300); graphs are keyed by (refreshes, selects) and replayed."""
    from tests.conftest import closure_graph_decoder, engine_for_dir, generate_greedy, random_ids

    ids = random_ids(prompt, seed=prompt)

    def engine():
        return engine_for_dir(tiny_llama_dir, None, ENGINE_HIP, method="hip", max_context_tokens=2048)

    eager = generate_greedy(engine(), ids, tokens).output_ids
    e = engine()
    graphs = closure_graph_decoder(e, min_bucket=256)
    keys, key = [], graphs.key
    graphs.key = lambda seq: keys.append(key(seq)) or keys[-1]
    assert generate_greedy(e, ids, tokens).output_ids == eager
    assert keys[0] is None and None not in keys[1:]  # the first step allocates the kept selections
    want = {(True, True), (False, True)} | ({(True, False), (False, False)} if prompt < 51 else set())
    assert {k[1] for k in keys[1:]} == want
    assert graphs.replays > 0 and graphs.captures + graphs.replays == len(keys) - 1
