"""Recover `eval ruler` samples from a run's log when its JSON did not come back from the device (a device call
returns at most 8 files): every sample line holds task, haystack, length, depth, seed, verdict, expected values,
output, seconds and, with --trace, the needle's token count and decode share. Writes a JSON with the same
"samples" records (fields the log lacks are absent) and the method named on the command line.

    python bench/ruler_log_samples.py g_ts.log --method tokenselect --config '{}' --output g_ts.json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

SAMPLE = re.compile(
    r"(niah_\w+) (\w+) len=(\d+) depth=([\d.]+) seed=(\d+): (ok|miss) expected\s*\[(.*?)\]\s*got\s*(['\"])(.*?)\8"
    r"\s*\(([\d.]+)s(?:, needle_tokens=(\d+), decode_mean=([\d.]+))?", re.S)


def samples_from_log(text: str) -> list[dict]:
    out = []
    for task, hay, length, depth, seed, verdict, expected, _, output, secs, needle, share in SAMPLE.findall(text):
        sample = {"task": task, "haystack": hay, "length": int(length), "depth": float(depth), "seed": int(seed),
                  "expected": ast.literal_eval(f"[{expected}]"), "output": output, "correct": verdict == "ok",
                  "seconds": float(secs), "source": "log"}
        if needle:
            sample["needle_trace"] = {"needle_tokens": int(needle), "decode_mean": float(share)}
        out.append(sample)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("--method", required=True, help="the method the run used")
    p.add_argument("--config", default="{}", help="its settings as JSON (what the plan passed)")
    p.add_argument("--model", default="gemma-3-270m-q4_k_m.gguf")
    p.add_argument("--output", required=True)
    args = p.parse_args()
    samples = samples_from_log(Path(args.log).read_text(errors="replace"))
    data = {"model": {"source": args.model}, "method": {"name": args.method, "config": json.loads(args.config)},
            "recovered_from": Path(args.log).name, "samples": samples}
    Path(args.output).write_text(json.dumps(data, indent=1))
    print(f"{len(samples)} samples ({sum(s['correct'] for s in samples)} correct) -> {args.output}")


if __name__ == "__main__":
    main()
