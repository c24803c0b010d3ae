"""docs/results.md from the benchmark JSON under docs/results/: one table per headline, each cell counted from
the raw files, each row with the command that reproduces it, device and date; plus the plots against context
(accuracy here; decode tokens/s, prefill time and KV memory in results_plots.py).

    python bench/results_page.py          # rewrites docs/results.md and docs/results/*_vs_context.png

results_tables.py holds the only hand-written part: which files make which row (a cell pools every sample of its
files at that length), the command, the device and the date. Samples recovered from a run's log
(`git show 29b96eb:bench/ruler_log_samples.py`) count like the others; the page says which rows include them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from results_common import D26, D27, RESULTS, ROOT, cell, length_label, passkey_rows
from results_hierarchy_repeat import HREP, hierarchy_repeat_markdown
from results_question_repeat import QREP, question_repeat_markdown, seed_passkey
from results_plots import memory_markdown
from results_repeats import repeat_span_markdown
from results_infinitehip import infinitehip_question_markdown
from results_speed import speed_markdown, tensor_parallel_markdown, ttft_markdown
from results_tables import FIXED_POSITIONS, GEMMA, POT, TABLES, VARY, AccuracyTable, file_rows, samples
from results_tokenselect import tokenselect_pool_markdown, tokenselect_question_markdown



def accuracy_markdown(table: AccuracyTable) -> tuple[str, dict[str, dict[int, float]]]:
    lines = [f"## {table.title}", "", f"Device: {table.device}. Dates: {table.dates}. {table.text}".strip(), "",
             "| row | " + " | ".join(length_label(n) for n in table.lengths) + " | command | note |",
             "| --- | " + " | ".join(":-:" for _ in table.lengths) + " | --- | --- |"]
    curves = {}
    for row in table.rows:
        by_length = defaultdict(list)
        for s in samples(row):
            by_length[s["length"]].append(s)
        lines.append(f"| {row.label} | " + " | ".join(cell(by_length[n]) for n in table.lengths)
                     + f" | `{row.command}` | {row.note} |")
        if row.seed is None:  # a one-seed row is a subset of its method's row: tabled, not plotted
            curves[row.label] = {n: sum(s["correct"] for s in by_length[n]) / len(by_length[n])
                                 for n in table.lengths if by_length[n]}
    lines.append("")
    lines.append("Raw files: " + ", ".join(sorted({f"`docs/results/{f}`" for r in table.rows for f in r.files})))
    return "\n".join(lines) + "\n", curves


def screen_markdown() -> str:
    """Gemma 3 at 512K: infinitehip settings screened on seeds 0-1 with the needle trace, the pick on held-out seed 2."""
    base = RESULTS / D26 / "gpu_d"
    variants = (("default", "ih_base.json", ""), ("last stage keeps 1,024", "ih_last1k.json", '{"keep_tokens": [32768, 8192, 1024]}'),
                ("question keeps 4,096", "ih_q4k.json", '{"question_keep_tokens": 4096}'),
                ("question keeps 1,024", "ih_q1k.json", '{"question_keep_tokens": 1024}'),
                ("stream 512", "ih_stream512.json", '{"stream_tokens": 512}'),
                ("question window 17", "ih_qwin17.json", '{"question_window": 17}'))
    if not all((base / f).exists() for _, f, _ in variants):
        return ""
    lines = ["## Gemma 3 270M at 512K: settings screened on seeds 0-1, needle traced", "",
             "Device: NVIDIA H100 80GB, bf16. Date: 2026-11-26. `infinitehip eval ruler --model gemma3-270m --haystacks "
             "essays --vary-haystack false --prefill-chunk-size 32768 --tasks niah_single_word --trace true --method infinitehip --lengths "
             "524288 --seeds 0 1 --method-config JSON`. Attended: share of the needle's tokens among the keys the "
             "prompt's last query block attends (prefill) and every answer step attends (decode), mean over the misses.", "",
             "| setting (--method-config) | seeds 0-1 | misses with the whole needle attended (prefill / decode) |",
             "| --- | :-: | :-: |"]
    for label, f, cfg in variants:
        rows = json.loads((base / f).read_text())["samples"]
        misses = [r for r in rows if not r["correct"]]
        whole = sum(1 for r in misses if (r.get("needle_trace") or {}).get("prefill_mean", {}).get("attended", 0) >= 0.999
                    and (r.get("needle_trace") or {}).get("decode_mean", 0) >= 0.999)
        lines.append(f"| {label}{f' `{cfg}`' if cfg else ''} | {cell(rows)} | {whole} of {len(misses)} |")
    low = 1.0
    for _, f, _ in variants:
        for r in json.loads((base / f).read_text())["samples"]:
            t = r.get("needle_trace") or {}
            if not r["correct"]:
                low = min(low, t.get("prefill_mean", {}).get("attended", 0), t.get("decode_mean", 0))
    held = json.loads((base / "ih_win_s2.json").read_text())["samples"]
    default_s2 = [r for r in json.loads((RESULTS / D26 / "gpu_c" / "gemma_512k_infinitehip.json").read_text())["samples"]
                  if r["seed"] >= 200000]
    at128 = json.loads((base / "ih_win_128k.json").read_text())["samples"]
    lines += ["", f"The screen's pick (question keeps 4,096, one more right answer) on held-out seed 2: {cell(held)}, "
              f"against the default's {cell(default_s2)} on the same prompts; at 128K (seeds 0-2) {cell(at128)}, as the "
              f"default. The default stays. The misses are reading misses: the lowest needle share attended by any "
              f"miss is {low:.2f} (prefill and decode minimum), most attend all of it."]
    return "\n".join(lines) + "\n"


def reading_markdown() -> str:
    """Gemma 3 at 1M: infinitehip's misses traced (is the needle attended?) and its answers with the needle forced in."""
    trace_f, oracle_f = RESULTS / VARY / "ih_trace_1m.json", RESULTS / VARY / "ih_oracle_1m.json"
    if not (trace_f.exists() and oracle_f.exists()):
        return ""
    key = lambda r: (r["seed"], r["depth"])  # noqa: E731
    trace = {key(r): r for r in json.loads(trace_f.read_text())["samples"]}
    oracle = {key(r): r for r in json.loads(oracle_f.read_text())["samples"]}
    default = {key(r): r for r in json.loads((RESULTS / VARY / "ih_vary_1m.json").read_text())["samples"]}
    both = sorted(set(trace) & set(oracle) & set(default))
    same = sum(trace[k]["correct"] == default[k]["correct"] for k in both)
    misses = [trace[k] for k in both if not trace[k]["correct"]]
    t = [(r["needle_trace"] or {}) for r in misses]
    whole = sum(1 for x in t if x.get("prefill_mean", {}).get("attended", 0) >= 0.999 and min(x.get("decode_step_min") or [0]) >= 0.999)
    by_question = sum(1 for k in both if trace[k]["needle_trace"]["prefill_mean"].get("question", 0) >= 0.999)
    by_stages = sum(1 for k in both if trace[k]["needle_trace"]["prefill_mean"].get("stage2", 0) > 0)
    up = sum(1 for k in both if oracle[k]["correct"] and not default[k]["correct"])
    down = sum(1 for k in both if default[k]["correct"] and not oracle[k]["correct"])
    cmd = f"{GEMMA} --method infinitehip --lengths 1048576"
    lines = ["## Gemma 3 270M at 1M: selection or reading?", "",
             "Device: NVIDIA H100 80GB, bf16. Date: 2026-11-26. The default `infinitehip`'s 1M prompts (the default "
             f"of that day, before `hierarchy_repeat_span`) re-run with the needle trace (`{cmd} --trace true`) and with the needle forced into every layer's selection "
             f"(`--oracle true`); {len(both)} of its 30 prompts (the device session ended before the last two).", "",
             "| prompts | default | trace run (same prompts) | oracle | misses with the whole needle attended (last prompt block and every answer step) | "
             "needle found by question-time selection / kept by the last pruning stage | oracle: miss -> right / right -> miss |",
             "| :-: | :-: | :-: | :-: | :-: | :-: | :-: |",
             f"| {len(both)} | {cell([default[k] for k in both])} | {cell([trace[k] for k in both])} | "
             f"{cell([oracle[k] for k in both])} | {whole} of {len(misses)} | {by_question} / {by_stages} of {len(both)} | "
             f"{up} / {down} |", "",
             f"The trace run repeats the default's answers on {same} of {len(both)} prompts. Every miss attends every "
             "needle token at every answer step, and forcing the needle in leaves the score as it is: at 1M the remaining misses "
             "are reading misses (the oracle answers one more prompt and loses another), and question-time selection, not the "
             "pruning hierarchy, is what finds the needle."]
    return "\n".join(lines) + "\n"


def repetition_markdown() -> str:
    """Is 1M on the essays hard because it is long or because it repeats the corpus ~7 times?"""
    span, sotu = D26 + "gpu_span/", D26 + "gpu_sotu/"
    if not (RESULTS / span / "ih_128k_span18724.json").exists():
        return ""
    cmd = f"{GEMMA} --lengths 131072 --seeds 0 1 --haystack-span 18724 --method M"
    lines = ["## Repetition, not length: the essays at 1M", "",
             "Device: NVIDIA H100 80GB, bf16. Date: 2026-11-26. Seeds 0-1 (20 prompts a cell, each in its own text), "
             "the defaults of that day (infinitehip before `hierarchy_repeat_span`, the next section). "
             "`--haystack-span 18724` repeats an 18,724-token stretch of the essays 7 times in a 128K "
             f"prompt, as a 1M prompt repeats the whole essays (`{cmd}`); sotu is the 2.4M-token haystack of the first "
             "table (no repetition at 1M).", "",
             "| method | essays 128K (no repetition) | essays 128K, a stretch 7 times | essays 1M (the corpus ~7 times) | "
             "sotu 1M (no repetition) |", "| --- | :-: | :-: | :-: | :-: |"]
    for label, short, vary in (("infinitehip", "ih", "ih"), ("tokenselect", "ts", "ts")):
        cells = [file_rows(VARY, f"{vary}_vary_128k.json"), file_rows(span, f"{short}_128k_span18724.json"),
                 file_rows(VARY, f"{vary}_vary_1m.json"), file_rows(sotu, f"sotu_{short}_1m.json")]
        lines.append(f"| {label} (default) | " + " | ".join(cell(c) for c in cells) + " |")
    trace = json.loads((RESULTS / span / "ts_trace_1m.json").read_text())["samples"]
    misses = [r for r in trace if not r["correct"]]
    low = min((r["needle_trace"] or {}).get("decode_mean", 0) for r in misses) if misses else 1.0
    lines += ["", "Seven copies of a stretch cost `infinitehip` 4 of 20 prompts at 128K, what the whole 1M costs it on the "
              "essays; on text that does not repeat it reads 1M as it reads 128K. `tokenselect` loses at 1M on both "
              f"haystacks. Its 1M misses on the essays are reading misses too: its 30 prompts re-run with the needle "
              f"trace (`--trace true`) score {cell(trace)} with the same answers, and every miss attends at least "
              f"{low:.2f} of the needle's tokens at every answer step (mean over steps)."]
    return "\n".join(lines) + "\n"


def infinipot_screen_markdown() -> str:
    """InfiniPot's pot size and NuC share screened on seeds 0-1 at 128K; the pick on held-out seed 2."""
    if not (RESULTS / POT / "ip_128k_p16k_c4k_nov0.json").exists():
        return ""
    variants = [("4K pot / 1K kept, NuC 0.5 (the default before)", VARY, "ip_vary_128k.json")] + [
        (f"{label}", POT, f"ip_128k_{name}.json") for label, name in (
            ("4K / 1K, NuC 0.1", "nov01"), ("8K / 2K, NuC 0.5", "p8k_c2k"), ("8K / 2K, no NuC", "p8k_c2k_nov0"),
            ("12K / 3K, NuC 0.5", "p12k_c3k"), ("16K / 4K, NuC 0.5", "p16k_c4k"), ("16K / 4K, NuC 0.25", "p16k_c4k_nov25"),
            ("**16K / 4K, no NuC (the pick)**", "p16k_c4k_nov0"), ("16K / 4K, NuC 0.5, pool 31", "p16k_c4k_pool31"),
            ("16K / 4K, NuC 0.5, question 128", "p16k_c4k_q128"), ("16K / 8K, NuC 0.5", "p16k_c8k"),
            ("24K / 6K, NuC 0.5", "p24k_c6k"), ("24K / 6K, no NuC", "p24k_c6k_nov0"), ("32K / 8K, NuC 0.5", "p32k_c8k"),
            ("32K / 16K, NuC 0.5", "p32k_c16k"))]
    lines = ["## InfiniPot: pot size and NuC share, screened at 128K", "",
             "Device: NVIDIA H100 80GB, bf16. Date: 2026-11-26. Gemma 3 270M, the essays, 128K, seeds 0-1 (20 prompts, "
             f"each in its own text): `{GEMMA} --method infinipot --lengths 131072 --seeds 0 1 --method-config "
             "'{\"pot_tokens\": M, \"compressed_tokens\": C, \"novelty_fraction\": a}'` (question in the catalyst, "
             "64 tokens, and pooling over 15 slots as before, unless stated).", "",
             "| pot / kept per distillation, NuC share | seeds 0-1 | held-out seed 2 | s/prompt |", "| --- | :-: | :-: | :-: |"]
    for label, folder, name in variants:
        path = RESULTS / folder / name
        if not path.exists():
            continue
        rows = file_rows(folder, name, length=131072)
        held = file_rows(folder, name, seeds=(2,), length=131072)
        sec = sum(r["seconds"] for r in rows) / len(rows)
        lines.append(f"| {label} | {cell(rows)} | {cell(held)} | {sec:.1f} |")
    lines += ["", "The pot is InfiniPot's whole KV memory: a 16K pot is 48 MiB for Gemma 3 (3 global layers) and 2 GiB "
              "for a Llama-3-8B-shaped model. Scores do not rise steadily with the pot (12K and 24K read less than 8K and "
              "16K); the pick ties with 8K / 2K without NuC, which ran after it had been picked and run on seed 2. The default (`pot_tokens` 0) takes half the trained "
              "length up to 16K, with NuC off from 8K up, so the embedded model (trained to 8K) keeps its 4K pot and NuC."]
    return "\n".join(lines) + "\n"


def precision_markdown() -> str:
    """Gemma 3 with infinitehip's default in float32 against the bf16 default's answers on the same prompts."""
    base = RESULTS / D26 / "gpu_fp32"
    files = sorted(base.glob("ih32_*.json"))
    if not files:
        return ""
    default = next(r for r in FIXED_POSITIONS.rows if r.label == "infinitehip (default)")
    bf16 = {(s["length"], s["seed"], s["depth"]): s for s in samples(default)}
    fp32 = {(s["length"], s["seed"], s["depth"]): s for f in files for s in json.loads(f.read_text())["samples"]}
    lines = ["## Gemma 3 270M in float32: is the default's miss a precision miss?", "",
             "Device: NVIDIA H100 80GB. Date: 2026-11-26. `infinitehip eval ruler --model gemma3-270m --haystacks essays "
             "--vary-haystack false --prefill-chunk-size 32768 --tasks niah_single_word --method infinitehip --dtype float32 --lengths N` "
             "(512K: `--seeds 0 1 --samples-per-depth 2`, then seed 2 held out); the bf16 column is the default's "
             "answers to the same prompts (its table above, same device kind). Seconds: mean per prompt, prefill and answer.",
             "", "| length | bf16 | float32 | bf16 miss -> fp32 right | bf16 right -> fp32 miss | s/prompt bf16 | s/prompt fp32 |",
             "| --- | :-: | :-: | :-: | :-: | :-: | :-: |"]
    for n in sorted({k[0] for k in fp32}):
        keys = [k for k in fp32 if k[0] == n and k in bf16]
        up = sum(1 for k in keys if fp32[k]["correct"] and not bf16[k]["correct"])
        down = sum(1 for k in keys if bf16[k]["correct"] and not fp32[k]["correct"])
        sec = [sum(d[k]["seconds"] for k in keys) / len(keys) for d in (bf16, fp32)]
        lines.append(f"| {length_label(n)} | {cell([bf16[k] for k in keys])} | {cell([fp32[k] for k in keys])} | {up} | "
                     f"{down} | {sec[0]:.1f} | {sec[1]:.1f} |")
    return "\n".join(lines) + "\n"


def passkey_markdown() -> str:
    """The SmolLM2 passkey sweep with the default (the regression check of accuracy and speed work)."""
    runs = [("default (`repeat_span` 32), 2026-11-27", HREP, "passkey_ih_hrep32_rs32"),
            ("the default before (`repeat_span` 0), 2026-11-27", HREP, "passkey_ih_hrep32"),
            ("the default before that (`hierarchy_repeat_span` 0), 2026-11-27", D27 + "gpu_repeat_check/",
             "passkey_ih_default")]
    tables = [(label, passkey_rows(folder, stem)) for label, folder, stem in runs]
    if not tables[0][1]:
        return ""
    lengths = sorted({r["length"] for r in tables[0][1]})
    ours = tables[0][1] + seed_passkey(QREP, "passkey_ih_rs32", 2)
    paper = sum((seed_passkey(QREP, "passkey_ih_3k", s) for s in (0, 1, 2)), [])
    old = seed_passkey(QREP, "passkey_ih_3k_c16", 0)
    lines = ["## Passkey, SmolLM2-135M (the embedded model), infinitehip", "",
             "Device: NVIDIA H100 80GB, bf16. Depths 10/30/50/70/90%, one pass key each, seeds 0-1 (`python -m bench "
             "accuracy --model smol.gguf --method infinitehip --lengths 65536 131072 262144 524288 1048576`, and "
             "`--seed 1`; the befores with `--method-config '{\"repeat_span\": 0}'` and "
             "`'{\"repeat_span\": 0, \"hierarchy_repeat_span\": 0}'`, each as the default of its run). Held-out seed "
             "2 and the paper's settings at the same code: the section on the question's vote above (the default "
             f"{cell(ours)} over seeds 0-2, paper `3k` {cell(paper)}). The 2026-11-24 sweep's seed-0 25/25 (`3k`, "
             f"16-token final chunks) reads {cell(old)} at today's code with its own setting.", "",
             "| row | " + " | ".join(length_label(n) for n in lengths) + " | all |",
             "| --- |" + " :-: |" * (len(lengths) + 1)]
    for label, rows in tables:
        lines.append(f"| {label} | " + " | ".join(cell([r for r in rows if r["length"] == n]) for n in lengths)
                     + f" | {cell(rows)} |")
    return "\n".join(lines) + "\n"


def plot(curves: dict[str, dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in curves.items():
        if points:
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context tokens")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Gemma 3 270M, code word in real prose (niah_single_word)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parts = ["# Results", "", "Generated by `python bench/results_page.py` from the JSON under `docs/results/`; do not "
             "edit by hand. Method details and diagnostics: `docs/real-text.md`; earlier studies: "
             "`docs/devlog.md`.", ""]
    for table in TABLES:
        text, curves = accuracy_markdown(table)
        parts.append(text)
        if table.plot:
            plot(curves, RESULTS / "accuracy_vs_context.png")
            parts.append("![accuracy vs context](results/accuracy_vs_context.png)\n")
    parts.append(repetition_markdown())
    parts.append(hierarchy_repeat_markdown())
    parts.append(question_repeat_markdown())
    parts.append(repeat_span_markdown())
    parts.append(reading_markdown())
    parts.append(tokenselect_pool_markdown())
    parts.append(tokenselect_question_markdown())
    parts.append(infinipot_screen_markdown())
    parts.append(screen_markdown())
    parts.append(precision_markdown())
    parts.append(infinitehip_question_markdown())
    parts.append(passkey_markdown())
    parts.append(speed_markdown())
    parts.append(ttft_markdown())
    commands = {}
    for row in FIXED_POSITIONS.rows:
        commands.setdefault(row.label.split()[0], row.command)
    parts.append(memory_markdown(commands))
    parts.append(tensor_parallel_markdown())
    (ROOT / "docs" / "results.md").write_text("\n".join(parts))
    print(f"wrote {ROOT / 'docs' / 'results.md'}")


if __name__ == "__main__":
    main()
