"""Screen method variants on a code-word needle in real prose (Paul Graham essays), with the needle probe.

Each variant is `METHOD[/PRESET][:FIELD=JSON[;FIELD=JSON...]]`, e.g. `tokenselect:vote_logits="raw"` or
`infinitehip/3k:head_aggregation="softmax"`. Every sample runs once as the method selects and, with --oracle,
once more with the needle forced into every selection; --trace records the needle's survival per layer/stage.
Results go to --output (JSON, rewritten after every sample). A quick screen beside `infinitehip eval ruler`.

    python bench/needle_screen.py --lengths 32768 131072 --depths 0.1 0.5 0.9 --seeds 0 1 --trace --oracle \
        --variants tokenselect 'tokenselect:vote_logits="raw"' infinitehip --output screen.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from infinitehip import LLM, EngineConfig
from infinitehip.attention.registry import method_spec
from infinitehip.config.sampling import SamplingParams
from infinitehip.eval.haystack import haystack_split
from infinitehip.eval.niah import insert_needle
from infinitehip.eval.sample import prompt_length, user_message

WORDS = ("amber", "falcon", "cobalt", "harbor", "juniper", "lantern", "meadow", "orchid", "pepper", "quartz",
         "raven", "saffron", "tundra", "velvet", "willow", "zephyr", "copper", "ember", "glacier", "indigo")
TASK = "Some important information is hidden in the following text. Read it carefully."
QUESTION = "What is the secret code word for the archive? Answer with the code word only."


def needle_sample(tokenizer, length: int, depth: float, seed: int) -> tuple[list[dict], str, str]:
    rng = random.Random(seed * 7919 + length + int(depth * 1000))
    value = f"{rng.choice(WORDS)}-{rng.randint(1000, 9999)}"
    needle = f"The secret code word for the archive is {value}."
    content = lambda before, after: f"{TASK}\n\n{insert_needle(before, after, needle)}\n\n{QUESTION}"
    base = prompt_length(tokenizer, user_message(content("", "")))
    n_hay = length - base
    for _ in range(2):  # size the haystack, then correct once from one measurement
        before, after = haystack_split(tokenizer, n_hay, round(depth * n_hay))
        messages = user_message(content(before, after))
        n_hay -= prompt_length(tokenizer, messages) - length
    return messages, needle, value


def needle_positions(tokenizer, messages: list[dict], text: str) -> list[int]:
    templated = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = tokenizer(templated, add_special_tokens=False, return_offsets_mapping=True)
    a = templated.index(text)
    return [i for i, (x, y) in enumerate(enc["offset_mapping"]) if x < a + len(text) and y > a]


def parse_variant(spec: str):
    head, _, fields = spec.partition(":")
    method, _, preset = head.partition("/")
    overrides = {k: json.loads(v) for k, v in (f.split("=", 1) for f in fields.split(";") if f)}
    return method, preset or None, overrides


def report(paths: list[str]) -> str:
    """Markdown table of screen results: accuracy as the method selects and with the oracle, and the needle's
    survival (mean over samples and layers) after each pruning stage and at decode."""
    rows = [r for path in paths for r in json.loads(Path(path).read_text())]
    keys = sorted({(r["variant"], r["length"]) for r in rows}, key=lambda k: (k[0], k[1]))
    stages = sorted({s for r in rows for s in (r["trace"].get("prefill_mean") or {})})
    lines = ["| variant | length | correct | oracle correct | " + " | ".join(f"{s} kept" for s in stages)
             + " | decode share |", "| --- | --: | :-: | :-: | " + " | ".join(":-:" for _ in stages) + " | :-: |"]
    mean = lambda xs: f"{sum(xs) / len(xs):.2f}" if xs else "–"
    for variant, length in keys:
        plain = [r for r in rows if (r["variant"], r["length"]) == (variant, length) and not r["oracle"]]
        oracle = [r for r in rows if (r["variant"], r["length"]) == (variant, length) and r["oracle"]]
        cell = lambda rs: f"{sum(r['correct'] for r in rs)}/{len(rs)}" if rs else "–"
        survival = [mean([r["trace"]["prefill_mean"][s] for r in plain if s in (r["trace"].get("prefill_mean") or {})])
                     for s in stages]
        decode = mean([r["trace"]["decode_mean"] for r in plain if r["trace"].get("decode_mean") is not None])
        lines.append(f"| `{variant}` | {length} | {cell(plain)} | {cell(oracle)} | " + " | ".join(survival) + f" | {decode} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--report", nargs="+", default=None, metavar="JSON", help="print the markdown table of these results")
    p.add_argument("--variants", nargs="+")
    p.add_argument("--lengths", type=int, nargs="+")
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--oracle", action="store_true")
    p.add_argument("--trace", action="store_true")
    p.add_argument("--model", default=None)
    p.add_argument("--model-cache-dir", default=None)
    p.add_argument("--prefill-chunk-size", type=int, default=32768)
    p.add_argument("--output")
    args = p.parse_args()
    if args.report:
        print(report(args.report))
        return
    if not args.variants or not args.lengths or not args.output:
        p.error("--variants, --lengths and --output are required (or --report)")
    results = []
    for spec in args.variants:
        method, preset, overrides = parse_variant(spec)
        engine = EngineConfig(model=args.model, model_cache_dir=args.model_cache_dir, method=method,
                              max_context_tokens=int(max(args.lengths) * 1.02) + 64,
                              prefill_chunk_size=args.prefill_chunk_size, show_progress=False)
        llm = LLM(config=engine, method_config=method_spec(method).config(preset, **overrides))
        for length in args.lengths:
            for seed in args.seeds:
                for depth in args.depths:
                    messages, needle, value = needle_sample(llm.tokenizer, length, depth, seed)
                    pos = needle_positions(llm.tokenizer, messages, needle)
                    for oracle in (False, True) if args.oracle else (False,):
                        t = time.perf_counter()
                        kw = dict(needle_tokens=pos, oracle=oracle) if (args.trace or oracle) else {}
                        out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=16), **kw)[0]
                        ok = value.lower() in out.text.lower()
                        tr = out.needle_trace or {}
                        row = dict(variant=spec, length=length, depth=depth, seed=seed, oracle=oracle, value=value,
                                   output=out.text, correct=ok, seconds=time.perf_counter() - t, trace=tr)
                        results.append(row)
                        brief = {k: round(v, 2) for k, v in (tr.get("prefill_mean") or {}).items() if v is not None}
                        dm = tr.get("decode_mean")
                        print(f"{spec} L={length} d={depth} s={seed} {'ORACLE ' if oracle else ''}{'ok  ' if ok else 'MISS'}"
                              f" {value} <- {out.text.strip()[:40]!r} {row['seconds']:.1f}s {brief}"
                              f" dec={dm if dm is None else round(dm, 2)}", flush=True)
                        Path(args.output).write_text(json.dumps(results, indent=1))
    print("variant | length | oracle | correct")
    keys = sorted({(r["variant"], r["length"], r["oracle"]) for r in results}, key=str)
    for v, L, o in keys:
        rows = [r for r in results if (r["variant"], r["length"], r["oracle"]) == (v, L, o)]
        print(f"{v} | {L} | {o} | {sum(r['correct'] for r in rows)}/{len(rows)}")


if __name__ == "__main__":
    main()
