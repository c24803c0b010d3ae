"""Speed tables, one function per bench suite's JSON: each manifest row shows the entries of its files that its
`select` picks (one line per entry), with the dense baseline of the same run where the suite measures one."""

from __future__ import annotations

from bench.report.accuracy import Curves, Lines, length_label
from bench.report.manifest import Manifest, Row, Table
from bench.report.store import ResultsError


def entries(manifest: Manifest, row: Row, default_source: str, match: bool = True) -> list[tuple[dict, dict]]:
    """(file, entry) for every entry of the row's files' `source` list that its select matches."""
    source = row.source or default_source
    out = []
    for name in row.files:
        data = manifest.load(row, name)
        items = data.get(source)
        if not isinstance(items, list) or not all(isinstance(e, dict) for e in items):
            raise ResultsError(f"{row.where}: {manifest.store / name} has no list `{source}`")
        for item in items:
            if not match or all(item.get(k) == v or (isinstance(v, list) and item.get(k) in v)
                                for k, v in row.select.items()):
                out.append((data, item))
    if not out:
        raise ResultsError(f"{row.where}: no entry of `{source}` in its files matches select {row.select}")
    return out


def field(row: Row, entry: dict, *keys: str):
    value = entry
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise ResultsError(f"{row.where}: an entry of its file lacks `{'.'.join(keys)}`")
        value = value[key]
    return value


def layer_decode(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    lines = []
    for row in rows:
        preset = row.select.get("preset", "default")
        for _, r in entries(manifest, row, "results", match=False):
            us = field(row, r, "ours_decode", preset, "engine_graph_amortized_us")
            dense = field(row, r, "dense", "decode_us")
            lines.append((row, [length_label(r["T"]), f"{us:.1f}", f"{dense:.0f}", f"{dense / us:.2f}x"]))
    return ["context", "decode us", "dense SDPA-flash us (same run)", "speedup"], lines, {}


def decode(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    lines = []
    for row in rows:
        for data, r in entries(manifest, row, "rows"):
            step = field(row, r, "step_ms")
            dense = {d["context"]: d["dense_ms"] for d in data.get("dense_layerwise") or []}
            ref = dense.get(r["context"])
            graph = "-" if r.get("graph_ms") is None else f"{r['graph_ms']:.2f}"
            lines.append((row, [length_label(r["context"]), r.get("mode", "-"), f"{step:.2f}", f"{1e3 / step:.1f}",
                                graph, "-" if ref is None else f"{ref:.2f} ({1e3 / ref:.1f} tokens/s)",
                                "-" if ref is None else f"{ref / step:.2f}x"]))
    return ["context", "KV", "ms/step", "tokens/s", "graph GPU ms/step", "dense layer-wise ms/step",
            "speedup"], lines, {}


def resident_decode(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    """`bench decode` with the KV resident: one line per (method, context), its speed beside the same run's dense
    step at that context and the weight-read bound (every weight read once a step)."""
    lines = []
    for row in rows:
        for data, r in entries(manifest, row, "rows"):
            median = field(row, r, "step_ms_median")
            dense = [d["step_ms_median"] for d in data["rows"]
                     if d.get("method") == "dense" and d.get("context") == r["context"]]
            lines.append((row, [r["method"], f"{r['context']:,}", f"{median:.2f} / {field(row, r, 'step_ms_mean'):.2f}",
                                f"{1e3 / median:.1f}", f"{dense[0] / median:.2f}x" if dense else "-",
                                f"{data['bound_step_s'] * 1e3:.2f}", f"{r['captures']} / {r['replays']}",
                                f"{r['prefill_s']:.1f}"]))
    return ["method", "context", "decode ms/step (median / mean)", "tokens/s (median)", "x dense (median)",
            "weight-read bound ms", "graphs captured / replays", "prefill s"], lines, {}


def bounded_memory(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    """`bench memory`: a bounded-memory method's KV allocation, prefill and decode speed per input length (one line
    per length), so a constant KV column shows the bound holds."""
    lines = []
    for row in rows:
        for data, r in entries(manifest, row, "rows"):
            lines.append((row, [data.get("method", "-"), length_label(field(row, r, "length")),
                                f"{field(row, r, 'kv_cache_mib'):,.0f}", f"{field(row, r, 'peak_mem_gib'):.1f}",
                                f"{field(row, r, 'ttft_s'):.2f}", f"{field(row, r, 'decode_tok_s'):.1f}"]))
    return ["method", "input", "KV cache MiB", "peak GPU GiB", "time to first token s", "decode tokens/s"], lines, {}


def hip_attn(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    def patterns(d: dict) -> str:
        return " / ".join(f"{v['ms'] * 1e3:.0f}" for v in sorted(d.values(), key=lambda v: v["ms"]))

    lines = []
    for row in rows:
        for _, r in entries(manifest, row, "results", match=False):
            ours, hip = field(row, r, "ours", "default"), field(row, r, "hip", "default")
            hip_prefill = min(v["prefill_ms"] for v in hip["prefill"].values() if "prefill_ms" in v)
            od, hd = ours["decode"], hip["decode"]
            lines.append((row, [
                length_label(r["T"]), f"{ours['prefill']['prefill_ms']:.1f}", f"{hip_prefill:.1f}",
                f"{r['dense']['decode_us']:.0f}", f"{od['engine_graph_amortized_us']:.1f}",
                f"{hd['graph_amortized_us']:.1f}", patterns(od["engine_graph_patterns"]),
                patterns(hd["graph_patterns"])]))
    return ["context", "ours prefill ms", "hip-attn prefill ms", "dense decode us", "ours decode us",
            "hip-attn decode us", "ours us by refresh pattern", "hip-attn us by refresh pattern"], lines, {}


def ttft(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    lines, curves = [], {}
    for row in rows:
        for _, r in entries(manifest, row, "rows"):
            if row.source == "dense_layerwise":
                mode, warm, cold = "-", field(row, r, "dense_ttft_s"), "-"
            else:
                mode, warm = r.get("mode", "-"), field(row, r, "warm_ttft_s")
                cold = (f"{r['cold_ttft_s']:.1f} ({length_label(r['cold_context'])})"
                        if r.get("cold_ttft_s") is not None else "-")
            lines.append((row, [length_label(r["context"]), mode, f"{warm:.1f}", cold]))
            curves.setdefault(row.label + ("" if mode == "-" else f", KV {mode}"), {})[r["context"]] = warm
    return ["context", "KV", "warm TTFT s", "cold TTFT s (length)"], lines, curves


def prefix_ttft(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    lines = []
    for row in rows:
        for _, r in entries(manifest, row, "rows"):
            verified = {True: "yes", False: "NO"}.get(r.get("verified_equal_to_caching_off"), "-")
            lines.append((row, [length_label(r["context"]), r["mode"], f"{field(row, r, 'ttft_first_s'):.2f}",
                                f"{field(row, r, 'ttft_second_s'):.3f}", f"**{100 * r['ratio']:.2f}%**", verified]))
    return ["document", "KV", "first TTFT s", "second TTFT s", "second / first", "verified"], lines, {}


def tensor_parallel(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    lines = []
    for row in rows:
        for _, r in entries(manifest, row, "rows"):
            if "error" in r:
                raise ResultsError(f"{row.where}: its TP={r.get('tp')} entry is an error: {r['error'][:200]}")
            cold = f"{r['cold_ttft_s']:.1f} ({length_label(r['cold_context'])})" if r.get("cold_ttft_s") else "-"
            lines.append((row, [
                str(r["tp"]), f"{r['context']:,}", f"{field(row, r, 'ttft_s'):.1f}", cold,
                "real" if r["ttft_real"] else "fast", f"{r['decode_tok_s']:.1f}",
                f"{r['decode_ms']:.1f} / {r['decode_ms_median']:.1f}", f"{r['rank0_peak_gpu_gb']:.1f}",
                r["rank0_plan"].split(": ", 1)[-1]]))
    return ["TP", "context", "TTFT s", "cold TTFT s (length)", "prefill", "decode tokens/s",
            "decode ms/step mean / median", "rank-0 peak GPU GB", "KV capacity per rank (planner)"], lines, {}


def batch_decode(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    """`bench batch-decode`: one line per (method, KV, context, N) cell, and one per cell the run skipped (out of
    memory, a refusal): a cell that did not run is said, not left out."""
    lines = []
    for row in rows:
        runs, cells = {}, list(entries(manifest, row, "rows"))
        # the same run's N = 1 bound per (method, KV, context): N x bound(1) / bound(N) is the most that N sequences
        # can gain over one when every step reads all weights and every sequence's whole KV (dense's traffic)
        alone = {(id(d), r["method"], r["mode"], r["context"]): r["bound_ms"] for d, r in cells if r["batch"] == 1}
        for data, r in cells:
            runs[id(data)] = data
            one = alone.get((id(data), r["method"], r["mode"], r["context"]))
            allowed = f"{r['batch'] * one / r['bound_ms']:.2f}" if one else "-"
            lines.append((row, [r["method"], r["mode"], f"{r['context']:,}", str(r["batch"]),
                                f"{field(row, r, 'step_ms_median'):.2f} / {field(row, r, 'step_ms_mean'):.2f}",
                                f"{r['tok_s']:.1f}",
                                f"{r['ratio_vs_batch_1']:.2f}", f"{r['bound_ms']:.2f}", allowed,
                                f"{r['captures']} / {r['replays']}"]))
        for data in runs.values():
            for s in data.get("skipped") or []:
                lines.append((row, [s["method"], s["mode"], f"{s['context']:,}", str(s["batch"]),
                                    f"not run: {s['why']}", "-", "-", "-", "-", "-"]))
    # the mean beside the median: a composition's first steps capture graphs (slow), which the median leaves out
    return ["method", "KV", "context", "N", "decode ms/step (median / mean)", "aggregate tokens/s (median)", "x N=1",
            "bytes-read bound ms", "x N=1 the whole-KV bound allows", "graphs captured / replays"], lines, {}


def paged_decode(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    """`bench paged-decode` (either op): one line per (N, context, rope tables, launch, splits) the row's select
    picks."""
    lines = []
    for row in rows:
        for _, r in entries(manifest, row, "rows"):
            launch = r["launch"] if r.get("splits") is None else f"{r['launch']}, {r['splits']} splits"
            if "us" not in r:  # a launch that did not compile
                lines.append((row, [str(r["batch"]), f"{r['context']:,}", r["tables"], launch,
                                    f"not run: {r.get('error', '?')}", "-", "-"]))
                continue
            lines.append((row, [str(r["batch"]), f"{r['context']:,}", r["tables"], launch, f"{r['us']:.1f}",
                                f"{r['gb_s']:.0f}", f"{r['fraction_of_bound']:.0%}"]))
    return ["N", "context", "rope tables", "launch (keys:warps:stages)", "us", "K/V GB/s", "of copy bandwidth"], \
        lines, {}


def method_latency(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    """`bench method-latency`: one line per (context, method), dense SDPA-flash of the same run beside each."""
    lines = []
    for row in rows:
        dense = {}
        picked = entries(manifest, row, "rows")
        for _, r in picked:
            if r["method"].startswith("dense"):
                dense[r["context"]] = r
        for _, r in picked:
            d = dense.get(r["context"])
            is_dense = r["method"].startswith("dense")
            speedup = "-" if is_dense or not d else f"{d['prefill_ms'] / r['prefill_ms']:.1f}x"
            refresh = f"{r['decode_us']:.1f}" if is_dense else f"{r['refresh_us']:.1f}"
            e2e = f"{r['decode_us']:.1f}" if is_dense else f"{r['e2e_us']:.1f}"
            lines.append((row, [length_label(r["context"]), r["method"], f"{r['prefill_ms']:.2f}", speedup, refresh,
                                e2e]))
    return ["context", "method", "prefill chunk ms", "x dense prefill", "decode us (fresh state: a refresh)",
            "decode us (mean of 16 eager steps)"], lines, {}


def server_latency(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    """`bench server-latency`: one line per concurrency level, and one for the mixed-batch check where the run made
    it (streams decoding while a long prompt is admitted: its TTFT, their longest gap against their median one)."""
    lines = []
    for row in rows:
        runs = {}
        for data, r in entries(manifest, row, "rows"):
            runs[id(data)] = data
            asked = field(row, data, "meta", "args", "prompt_tokens")
            counted = (data.get("prompt_tokens") or {}).get(str(asked))  # None: a run before prompts were counted
            prompt = f"{counted:,}" if counted else f"{asked:,} words"
            lines.append((row, [f"{data['method']}", prompt, str(r["clients"]), str(r["requests"]),
                                f"{r['ttft_p50_s']:.3f} / {r['ttft_max_s']:.3f}", f"{r['itl_mean_ms']:.1f}",
                                f"{r['decode_tok_s_per_stream']:.1f}", f"{r['aggregate_tok_s']:.1f}"]))
        for data in runs.values():
            a = data.get("admission")
            if a:
                asked = a["admit_prompt_tokens"]
                counted = (data.get("prompt_tokens") or {}).get(str(asked))
                lines.append((row, [f"{data['method']}", f"{counted or asked:,}{'' if counted else ' words'} admitted",
                                    f"{a['streams']} decoding", "1", f"{a['admit_ttft_s']:.3f} (the admitted)",
                                    f"longest {a['itl_during_max_ms']:.1f} (median before "
                                    f"{a['itl_before_median_ms']:.1f})", "-", "-"]))
    return ["method", "prompt tokens", "clients", "requests", "TTFT p50 / max s", "ITL mean ms",
            "decode tokens/s a stream", "aggregate tokens/s"], lines, {}
