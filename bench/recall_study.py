"""Offline top-k recall study: capture q/k of one prompt once, then score many selection variants quickly.

A dense prefill of a real prompt (passkey / NIAH, chat template) records every layer's pre-RoPE queries; the
paged cache keeps the keys. For each variant (an InfiniteHiPConfig, given as preset overrides) the method's
own pruning code runs offline on that layer's data: landmark saliency fed chunk by chunk as in the engine,
then the pruning stages for the last `--rows` queries (one prefill chunk ending at the prompt's end), and
the key list of every query block is scored with `topk_recall.selection_recall` (exact causal attention at
original positions; oracle = per-head top-k of the same budget).

Unlike `topk_recall.py` the q/k are a dense run's (the true activations), so only the selection is compared.

    python bench/recall_study.py --length 4096 --rows 256 \
        --variant base: --variant none:late_pruning_rope=none,early_pruning_rope=none
Overrides: FIELD=VALUE separated by ',' ... tuples with '/': keep_tokens=2048/512/256. A variant name containing
'+exact', '+mass' or '+recent' scores chunks with that oracle (`recall_oracles.py`; landmark representative mode only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's infinitehip, not an installed one
from topk_recall import build_prompt, selection_recall  # noqa: E402

from infinitehip import EngineConfig, SamplingParams  # noqa: E402
from infinitehip.attention.base import ForwardBatch, SequenceSlice  # noqa: E402
from infinitehip.attention.dense import DenseAttention  # noqa: E402
from infinitehip.attention.infinitehip.method import InfiniteHiPAttention, assemble_keys  # noqa: E402
from infinitehip.config.infinitehip import InfiniteHiPConfig, infinitehip_preset  # noqa: E402
from infinitehip.engine.llm_engine import LLMEngine  # noqa: E402
from infinitehip.model.gguf_convert import default_cache_root  # noqa: E402
from infinitehip.model.loading import load_model  # noqa: E402

# CPU-scale budgets (1/4 of the 3k preset at 8K, see docs/results/recall_study_cpu.md).
SMALL = dict(sink_tokens=64, stream_tokens=256, keep_tokens=(2048, 512, 256), chunk_sizes=(64, 16, 4),
             early_last_keep_tokens=512, landmark_window=128)


class Capture(DenseAttention):
    """Dense attention that keeps each layer's pre-RoPE queries [L, H, d] (prefill)."""

    def __init__(self, model_config):
        super().__init__(model_config)
        self.q: dict[int, list[torch.Tensor]] = {}

    def prefill(self, layer, q, seq, batch):
        self.q.setdefault(layer, []).append(q.detach().clone())
        self.page_table = seq.page_table.clone()
        return super().prefill(layer, q, seq, batch)


class Probe(InfiniteHiPAttention):
    """The method's selection for one chunk; `_attend_prefill` measures instead of attending."""

    rows_measured: torch.Tensor

    def _attend_prefill(self, layer, q, seq, batch, final, blocks, window_start):
        key_tokens, key_counts = assemble_keys(final, blocks.last_position, window_start, self.config.sink_tokens)
        self.result = selection_recall(q, seq, batch, layer, key_tokens, key_counts, window_start, blocks.size,
                                       self.config.sink_tokens, self.rows_measured)
        return q


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    fields = {f.name: f for f in dataclasses.fields(InfiniteHiPConfig)}
    out = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in fields:
            sys.exit(f"unknown field {key!r}")
        default = getattr(InfiniteHiPConfig(), key)
        if isinstance(default, tuple):
            out[key] = tuple(int(v) for v in value.split("/"))
        elif isinstance(default, bool):
            out[key] = value.lower() in ("1", "true", "yes")
        elif isinstance(default, int):
            out[key] = int(value)
        elif isinstance(default, float):
            out[key] = float(value)
        else:
            out[key] = value
    return name, out


@torch.no_grad()
def evaluate(cfg: InfiniteHiPConfig, engine: LLMEngine, qs: dict[int, torch.Tensor], page_table: torch.Tensor,
             length: int, rows: int, chunk: int, sample_rows: int, layers: list[int]) -> dict:
    cfg = dataclasses.replace(cfg, dense_when_unpruned=False)
    method = Probe(engine.model_config, cfg)
    rope, cache = engine.rope, engine.cache
    start = length - rows
    measured = torch.linspace(0, rows - 1, min(sample_rows, rows)).round().long().unique()
    method.rows_measured = measured
    out = {}
    for layer in layers:
        q = qs[layer]
        if method.saliency is not None:  # saliency as the engine feeds it: prefill chunks, then the measured one
            for s in range(0, start, chunk):
                e = min(s + chunk, start)
                method.saliency.update(layer, q[s:e], s, page_table, cache, rope)
        seq = SequenceSlice(0, 0, rows, start, start, page_table, cache, None, True)
        batch = ForwardBatch([seq], cache, rope, rows)
        method.prefill(layer, q[start:], seq, batch)
        out[layer] = method.result
    return out


def summarize(res: dict) -> tuple[float, float]:
    ratios = [r["mass"] / r["oracle"] for r in res.values()]
    parts = [(r["mass"] - r["free"]) / (r["cond_oracle"] - r["free"]) for r in res.values() if r["cond_oracle"] - r["free"] > 1e-6]
    return statistics.fmean(ratios), (statistics.fmean(parts) if parts else float("nan"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--rows", type=int, default=256, help="queries of the measured (last) chunk")
    p.add_argument("--sample-rows", type=int, default=32)
    p.add_argument("--chunk", type=int, default=4096, help="engine prefill chunk (saliency feeding)")
    p.add_argument("--task", choices=["niah", "passkey"], default="passkey")
    p.add_argument("--depth", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-small", action="store_true", help="do not apply the CPU-scale budgets (SMALL)")
    p.add_argument("--variant", action="append", default=[], help="NAME:FIELD=VALUE,... (tuples: a/b/c)")
    p.add_argument("--layers", default="all", help="'all' or comma-separated layer indices")
    p.add_argument("--per-layer", action="store_true")
    p.add_argument("--output", default=None)
    args = p.parse_args()

    t0 = time.perf_counter()
    econf = EngineConfig(method="dense", device="cpu", dtype="float32", prefill_chunk_size=args.chunk,
                         max_context_tokens=args.length + 1024, show_progress=False)
    loaded = load_model(None, default_cache_root(), econf.torch_device(), econf.torch_dtype())
    engine = LLMEngine(econf, loaded)
    task, ids, sample = build_prompt(engine, args.task, args.length, args.depth, args.seed)
    ids = ids[: args.length]
    cap = Capture(engine.model_config)
    engine.method = engine.runner.method = cap
    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=1))
    while not seq.is_finished:  # a single request: its freed pages keep their k/v (nothing else writes them)
        engine.step()
    page_table = cap.page_table
    qs = {layer: torch.cat(v)[: len(ids)] for layer, v in cap.q.items()}
    L = len(ids)
    print(f"# recall study: {task} {L} tokens, depth {args.depth}, last {args.rows} queries, "
          f"{args.sample_rows} sampled rows; capture {time.perf_counter() - t0:.1f} s", flush=True)
    layers = list(range(engine.model_config.num_layers)) if args.layers == "all" else [int(x) for x in args.layers.split(",")]
    base = dict(SMALL) if not args.no_small else {}
    results = {}
    print("| variant | mean ratio | selected-part recall | early (0-2) ratio | late ratio | s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for text in args.variant or ["base:"]:
        name, over = parse_variant(text)
        oracle = next((t for t in name.split("+") if t in ("exact", "mass", "recent")), None)
        if oracle or "recall_oracles" in sys.modules:  # a name with +exact / +mass scores with that oracle
            import recall_oracles

            recall_oracles.install(oracle)
        cfg = infinitehip_preset("3k", impl="reference", **{**base, **over})
        t = time.perf_counter()
        res = evaluate(cfg, engine, qs, page_table, L, args.rows, args.chunk, args.sample_rows, layers)
        ratio, part = summarize(res)
        early = [r["mass"] / r["oracle"] for l, r in res.items() if l < cfg.early_layers]
        late = [r["mass"] / r["oracle"] for l, r in res.items() if l >= cfg.early_layers]
        print(f"| {name} | {ratio:.2%} | {part:.1%} | {statistics.fmean(early) if early else float('nan'):.2%} | "
              f"{statistics.fmean(late) if late else float('nan'):.2%} | {time.perf_counter() - t:.0f} |", flush=True)
        if args.per_layer:
            for l, r in res.items():
                g = r["cond_oracle"] - r["free"]
                print(f"    layer {l}: ratio {r['mass'] / r['oracle']:.3f} part {(r['mass'] - r['free']) / g if g > 1e-6 else float('nan'):.3f} "
                      f"free {r['free']:.3f} oracle {r['oracle']:.3f} keys {r['budget_mean']:.0f}")
        results[name] = {"overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in over.items()},
                         "mean_ratio": ratio, "selected_part_recall": part, "layers": res}
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"args": vars(args), "small": {k: list(v) if isinstance(v, tuple) else v for k, v in base.items()},
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
