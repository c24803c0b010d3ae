"""The results page's plots against context length, each drawn from the raw JSON under docs/results/ and returned
as the markdown that links it (image + caption with device, date and source files):

    decode_plot()   decode tokens/s of one Llama-3-8B-shaped attention layer, dense vs infinitehip presets
    prefill_plot()  time to first token of the 8B-shaped model (random weights), infinitehip vs dense
    memory_markdown()  KV memory table (Gemma 3 270M runs of the accuracy table, `python -m bench memory`) + plot

Matplotlib with the Agg backend; one 7x4 PNG per plot at dpi 100, x axis log2 in tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

from results_common import D25, D26, RESULTS, length_label

DPI = 100


def line_plot(series: list[tuple[str, dict[int, float], dict]], path: Path, title: str, ylabel: str,
              logy: bool = True) -> None:
    """One line per (label, {context: value}, matplotlib style); log2 x in tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(7, 4))
    xs_all = set()
    for label, points, style in series:
        if points:
            xs = sorted(points)
            xs_all.update(xs)
            ax.plot(xs, [points[x] for x in xs], label=label, **{"marker": "o", **style})
    ax.set_xscale("log", base=2)
    ticks = []
    for x in sorted(xs_all):  # one tick where lengths sit close (32,000 and 32,768; 7,000 and 8,192)
        if not ticks or x / ticks[-1] >= 1.3:
            ticks.append(x)
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: length_label(int(round(x)))))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("context tokens (log2)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def image(name: str, alt: str, caption: str) -> str:
    return f"![{alt}](results/{name})\n\n*{caption}*"


def rel(path: Path) -> str:
    return f"`{path.relative_to(RESULTS.parents[1])}`"


def column_labels(lengths: list[int]) -> list[str]:
    """length_label, with exact token counts where two lengths would read the same (32,000 and 32,768)."""
    labels = [length_label(n) for n in lengths]
    return [f"{n:,}" if labels.count(lab) > 1 else lab for n, lab in zip(lengths, labels)]


def decode_plot() -> str:
    """One layer's decode step at 128K-1M (suite attention-latency, 2026-11-24: the only run with several contexts
    and CUDA-graph timings) plus the 1M points of the table's run (2026-11-26, preset default)."""
    sweep_path = RESULTS / "2026-11-24" / "attention_latency_graph.json"
    table_path = RESULTS / D26 / "gpu_b" / "attention_latency_default.json"
    if not sweep_path.exists():
        return ""
    sweep = json.loads(sweep_path.read_text())
    dense = {r["T"]: 1e6 / r["dense"]["decode_us"] for r in sweep["results"]}
    presets = sorted({p for r in sweep["results"] for p in r.get("ours_decode") or {}})
    series = [("dense SDPA-flash", dense, {"color": "black"})]
    for p in presets:
        series.append((f"infinitehip {p}", {r["T"]: 1e6 / r["ours_decode"][p]["engine_graph_amortized_us"]
                                            for r in sweep["results"] if p in (r.get("ours_decode") or {})}, {}))
    files = [sweep_path]
    if table_path.exists():
        files.append(table_path)
        t = json.loads(table_path.read_text())["results"][0]
        series.append(("dense, 2026-11-26 run (table)", {t["T"]: 1e6 / t["dense"]["decode_us"]},
                       {"color": "black", "marker": "s", "markerfacecolor": "none", "linestyle": "none"}))
        for name, d in t["ours_decode"].items():
            series.append((f"infinitehip {name}, 2026-11-26 run (table)",
                           {t["T"]: 1e6 / d["engine_graph_amortized_us"]},
                           {"marker": "D", "markerfacecolor": "none", "linestyle": "none"}))
    device = sweep["header"]["device"]
    line_plot(series, RESULTS / "decode_vs_context.png",
              f"Decode, one Llama-3-8B-shaped attention layer (random K/V, bf16)\n{device}, 2026-11-24 sweep "
              "+ 2026-11-26 1M points", "decode tokens/s of one layer (1e6 / us per step)")
    lengths = ", ".join(length_label(n) for n in sorted(dense))
    return image("decode_vs_context.png", "decode tokens/s vs context",
                 f"Decode tokens/s of one attention layer (32 query / 8 KV heads, d 128, random bf16 K/V, not a trained "
                 f"model) vs context, {device}: lines from the 2026-11-24 sweep ({lengths}; presets of that day, "
                 "dense from the same run; `python -m bench attention-latency --contexts 131072 262144 524288 "
                 "1048576 --presets 3k 3k-fast 3k-flash --skip-prefill --budget-s 1`), hollow markers the table's 1M run "
                 "(2026-11-26, dense from that run). infinitehip: the engine's CUDA-graph step amortized over a "
                 "refresh cycle. One layer only: a whole model's step (32 layers and the linear layers) is in the table "
                 "below. Files: " + ", ".join(rel(p) for p in files))


def prefill_plot() -> str:
    """Warm TTFT of the TTFT table's three runs (suite prefill): infinitehip resident / offloaded, dense engine and
    the layer-wise dense estimate, per context."""
    base = RESULTS / D26 / "ttft"
    files = [base / f for f in ("ttft_128k.json", "ttft_256k.json", "ttft_512k_1m.json")]
    if not all(f.exists() for f in files):
        return ""
    runs = [json.loads(f.read_text()) for f in files]
    curves: dict[str, dict[int, float]] = {}
    for run in runs:
        for r in run["rows"]:
            if "error" in r:
                continue
            label = ("infinitehip default, " if r["method"] == "infinitehip" else "dense engine, ") + (
                "KV offloaded (FP8 host store)" if r["mode"] == "offloaded" else "KV resident")
            curves.setdefault(label, {})[r["context"]] = r["warm_ttft_s"]
        for d in run.get("dense_layerwise") or []:
            curves.setdefault("dense, layer-wise estimate (SDPA-flash)", {})[d["context"]] = d["dense_ttft_s"]
    styles = {"dense engine": {"color": "black", "marker": "s"}, "dense, layer-wise": {"color": "gray", "linestyle": "--"}}
    series = [(label, pts, next((s for k, s in styles.items() if label.startswith(k)), {}))
              for label, pts in sorted(curves.items())]
    device = runs[0]["meta"]["device"]
    line_plot(series, RESULTS / "prefill_vs_context.png",
              f"Time to first token, Llama-3.1-8B-shaped model, RANDOM bf16 weights\n{device}, 2026-11-26",
              "warm TTFT s (log)")
    measured = "; ".join(f"{label}: {', '.join(length_label(n) for n in sorted(pts))}"
                         for label, pts in sorted(curves.items()))
    return image("prefill_vs_context.png", "prefill time vs context",
                 f"Warm time to first token vs context of the table above: Llama-3.1-8B-shaped model with random bf16 "
                 f"weights (not a trained model), {device}, 2026-11-26, the three `python -m bench prefill` runs of "
                 f"the table (same machine). Measured lengths: {measured}. Dense engine beyond 256K: its KV does not "
                 "fit the GPU. Files: " + ", ".join(rel(p) for p in files))


# KV memory: the Gemma 3 270M accuracy runs' `kv_memory` block (bf16, H100) and `python -m bench memory` (InfiniPot).
GEMMA_KV = {
    "dense": [D25 + "gemma_dense.json", D26 + "gpu_a/gemma_dense_calibration.json"],
    "infinitehip": [D26 + "gpu_b/gemma_short_infinitehip.json", D25 + "gpu_default/gemma_infinitehip_question.json",
                    D26 + "gpu_c/gemma_128k_infinitehip.json", D26 + "gpu_c/gemma_512k_infinitehip.json",
                    D26 + "gpu_a/gemma_1m_infinitehip.json", D26 + "gpu_c/gemma_1m_infinitehip_s1.json"],
    "tokenselect": [D26 + "gpu_b/gemma_short_tokenselect.json", D25 + "gemma_tokenselect.json",
                    D26 + "gpu_c/gemma_512k_tokenselect.json", D26 + "gpu_a/gemma_1m_tokenselect.json",
                    D26 + "gpu_c/gemma_1m_tokenselect_s1.json"],
    "infinipot": [D26 + "gpu_b/gemma_infinipot_heldout.json", D26 + "gpu_b/gemma_infinipot_1m.json"],
    "streaming": [D26 + "gpu_a/gemma_streaming.json"],
    "truncate": [D26 + "gpu_a/gemma_truncate.json"],
}
MEMORY_RUNS = [  # (label, file, device, date, command)
    ("infinipot, 8B-shaped (random bf16 weights), pot 4,096", "2026-11-22b/infinipot_memory.json",
     "NVIDIA H100 80GB", "2026-11-22",
     "python -m bench memory --lengths 8192 32768 131072 --pot-tokens 4096 --model random8b"),
    ("infinipot `4k-retrieval`, SmolLM2-135M", "2026-11-25/infinipot_memory_retrieval.json", "NVIDIA H100 80GB",
     "2026-11-25", "python -m bench memory --lengths 65536 262144 1048576 --preset 4k-retrieval --model smol.gguf "
                   "--prefill-chunk-size 32768"),
]
MIB = 1024 * 1024


def gemma_kv() -> dict[str, dict[int, float]]:
    """Per method: KV MiB (full-attention slots + sliding rings) at the longest prompt of each file (the engine
    sizes its cache for the run's longest prompt)."""
    out: dict[str, dict[int, float]] = {}
    for method, files in GEMMA_KV.items():
        for f in files:
            path = RESULTS / f
            if not path.exists():
                continue
            data = json.loads(path.read_text())
            kv = data.get("kv_memory")
            if not kv or not data.get("samples"):
                continue
            n = max(s["length"] for s in data["samples"])
            out.setdefault(method, {})[n] = sum(v["bytes"] for v in kv.values()) / MIB
    return out


def memory_markdown(commands: dict[str, str]) -> str:
    """commands: method -> the accuracy table's command for that method's Gemma 3 row."""
    gemma = gemma_kv()
    runs = [(label, json.loads((RESULTS / f).read_text())["rows"], f, device, date, cmd)
            for label, f, device, date, cmd in MEMORY_RUNS if (RESULTS / f).exists()]
    if not gemma and not runs:
        return ""
    lengths = sorted({n for pts in gemma.values() for n in pts} | {r["length"] for _, rows, *_ in runs for r in rows})
    lines = ["## KV memory vs context", "",
             "KV cache the engine allocated, MiB. Gemma 3 270M rows: the `kv_memory` block of the accuracy table's "
             "runs (bf16; 3 full-attention layers at 3,072 bytes per cached token + 15 sliding-window layers holding "
             "a fixed 512-token ring, 127.5 MiB), one value per file at its longest prompt (the cache is sized for "
             "it). dense, infinitehip and tokenselect keep every token's K/V (infinitehip and tokenselect save "
             "attention compute, not KV; infinitehip can move it to host memory, see the TTFT table); infinipot keeps "
             "a 4,096-token pot, streaming a sink + window, truncate the capacity it truncates to. InfiniPot rows: "
             "`python -m bench memory` (KV cache MiB of its JSON).", "",
             "| row | " + " | ".join(column_labels(lengths)) + " | device | date | command |",
             "| --- | " + " | ".join("---:" for _ in lengths) + " | --- | --- | --- |"]
    for method, pts in gemma.items():
        lines.append(f"| Gemma 3 270M, {method} | " + " | ".join(f"{pts[n]:,.0f}" if n in pts else "–" for n in lengths)
                     + f" | NVIDIA H100 80GB, bf16 | 2026-11-25 and 2026-11-26 | `{commands[method]}` |")
    for label, rows, _, device, date, cmd in runs:
        pts = {r["length"]: r["kv_cache_mib"] for r in rows}
        lines.append(f"| {label} | " + " | ".join(f"{pts[n]:,.0f}" if n in pts else "–" for n in lengths)
                     + f" | {device} | {date} | `{cmd}` |")
    gemma_files = [f for fs in GEMMA_KV.values() for f in fs if (RESULTS / f).exists()]
    lines += ["", "Raw files: " + ", ".join(f"`docs/results/{f}`" for f in gemma_files + [r[2] for r in runs]), ""]
    styles = {"dense": {"color": "black"}, "infinitehip": {"linewidth": 4, "alpha": 0.6},
              "tokenselect": {"linestyle": "--", "marker": "x"}}
    series = [(f"Gemma 3 270M, {m}", pts, styles.get(m, {})) for m, pts in gemma.items()]
    series += [(label.replace("`", ""), {r["length"]: r["kv_cache_mib"] for r in rows}, {"linestyle": ":"})
               for label, rows, *_ in runs]
    line_plot(series, RESULTS / "kv_memory_vs_context.png",
              "KV cache allocated vs context (Gemma 3 270M accuracy runs, bf16, H100, 2026-11-25/26;\n"
              "InfiniPot, python -m bench memory, H100, 2026-11-22 / 2026-11-25)", "KV cache MiB (log)")
    measured = "; ".join(f"{m}: {', '.join(length_label(n) for n in sorted(pts))}" for m, pts in gemma.items())
    lines.append(image("kv_memory_vs_context.png", "KV memory vs context",
                       "KV cache MiB vs context, NVIDIA H100 80GB. Solid: Gemma 3 270M (trained weights), bf16, "
                       f"2026-11-25 and 2026-11-26, lengths measured per method: {measured}. Dotted: InfiniPot's pot "
                       "from `python -m bench memory`, the 8B-shaped model with random weights (2026-11-22) and "
                       "SmolLM2-135M (2026-11-25). Dense Gemma 3 ran up to 32K only; it stores the same 3,072 bytes "
                       "per token as infinitehip and tokenselect."))
    lines.append("")
    return "\n".join(lines) + "\n"
