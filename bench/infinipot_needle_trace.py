"""Where InfiniPot loses a passkey: the needle's digit tokens through every distillation of one prompt.

Per distillation after the needle entered the pot: how many of its digit tokens NuC kept (token-level, every
layer and KV head), how many layer/head rows hold each digit after it (CaP keeps per row), the needle digits'
NLL, the lowest NLL NuC still kept and how much of NuC comes from the document before the needle; at the end,
how many rows hold each token of the needle sentence and of the prompt's start (the attention sink).
The question behind it: NuC reads each token's NLL from when the token was processed, so could its slots fill
with the most surprising tokens ever seen and shut a later needle out? (On the embedded model they do not: the
needle stays in every row; docs/benchmarks.md, issue 6.)

    python bench/infinipot_needle_trace.py --length 131072 --depth 0.1 --device cuda
"""

from __future__ import annotations

import argparse
import json

import torch
from passkey_probe import add_probe_args, load_probe  # bench/ is the script's directory, first on sys.path

from infinitehip import SamplingParams
from infinitehip.attention.infinipot import method as method_module
from infinitehip.config.infinipot import InfiniPotConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_probe_args(p, length=131072)
    p.add_argument("--novelty-fraction", type=float, default=InfiniPotConfig.novelty_fraction)
    p.add_argument("--sink-tokens", type=int, default=InfiniPotConfig.sink_tokens)
    args = p.parse_args()

    config = InfiniPotConfig(novelty_fraction=args.novelty_fraction, sink_tokens=args.sink_tokens)
    probe = load_probe(args, "infinipot", config)
    llm, sample, seed, ids, needle = probe.llm, probe.sample, probe.seed, probe.ids, probe.needle
    tokenizer = llm.tokenizer
    needle_t = torch.tensor(needle)
    span = list(range(needle[0] - 8, needle[-1] + 6))  # the needle sentence and a little around it

    rows: list[dict] = []
    pending: dict = {}
    novelty_tokens, select_slots = method_module.novelty_tokens, method_module.select_slots

    def novelty_spy(slot_tokens, slot_nll, nll_known, count):
        novel = novelty_tokens(slot_tokens, slot_nll, nll_known, count)
        first_row, nll = slot_tokens[0, 0].cpu(), slot_nll[0, 0].cpu()
        novel_cpu = novel.cpu()
        at = torch.isin(first_row, novel_cpu)
        digits_in_row0 = torch.isin(first_row, needle_t)
        pending.update(
            newest_token=int(slot_tokens.max()),
            nuc_digits=int(torch.isin(needle_t, novel_cpu).sum()),
            nuc_min_nll=float(nll[at].min()) if at.any() else None,
            nuc_before_needle=float((novel_cpu < needle[0]).float().mean()) if novel_cpu.numel() else None,
            digit_nll=[round(float(x), 2) for x in nll[digits_in_row0]],
        )
        return novel

    def select_spy(cap_scores, slot_tokens, novel, keep):
        kept = select_slots(cap_scores, slot_tokens, novel, keep)
        kept_tokens = slot_tokens.gather(2, kept).cpu()  # [L, Hkv, C]

        def rows_holding(tokens) -> list[int]:  # per token: how many of the L * Hkv rows still hold it
            return [int((kept_tokens == t).any(dim=2).sum()) for t in tokens]

        if pending.get("newest_token", -1) >= needle[0]:
            rows.append(dict(pending, rows_holding=rows_holding(needle), sentence_rows_holding=rows_holding(span),
                             prompt_start_rows_holding=rows_holding(range(16))))
        pending.clear()
        return kept

    method_module.novelty_tokens, method_module.select_slots = novelty_spy, select_spy
    (out,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=args.max_tokens))

    mc = llm.engine.model_config
    total_rows = mc.num_layers * mc.num_kv_heads
    print(f"length {len(ids)}, depth {args.depth}, seed {seed}, novelty_fraction {args.novelty_fraction}, "
          f"sink_tokens {args.sink_tokens}, needle "
          f"tokens {needle[0]}..{needle[-1]}, answer {sample.answer!r}, output {out.text!r}")
    print(f"| distillation (newest token) | NuC needle digits of {len(needle)} | lowest NuC NLL | NuC share from "
          f"before the needle | needle digit NLLs | rows (of {total_rows}) holding each digit after it |")
    print("| ---: | ---: | ---: | ---: | --- | --- |")
    shown = [r for i, r in enumerate(rows) if i < 6 or i == len(rows) - 1 or i % max(1, len(rows) // 12) == 0]
    for r in shown:
        low = "-" if r["nuc_min_nll"] is None else f"{r['nuc_min_nll']:.2f}"
        share = "-" if r["nuc_before_needle"] is None else f"{r['nuc_before_needle']:.2f}"
        print(f"| {r['newest_token']} | {r['nuc_digits']} | {low} | {share} | {r['digit_nll']} | {r['rows_holding']} |")
    if rows:  # what the pot holds of the needle sentence when the question arrives
        print("\nneedle sentence after the last distillation: token, rows holding it")
        print(" ".join(f"{tokenizer.decode([ids[t]])!r}:{n}" for t, n in zip(span, rows[-1]["sentence_rows_holding"])))
        print("the prompt's first 16 tokens after the last distillation: token, rows holding it")
        print(" ".join(f"{tokenizer.decode([ids[t]])!r}:{n}" for t, n in enumerate(rows[-1]["prompt_start_rows_holding"])))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(length=len(ids), depth=args.depth, seed=seed, novelty_fraction=args.novelty_fraction,
                           sink_tokens=args.sink_tokens,
                           needle=needle, answer=sample.answer, output=out.text, correct=sample.is_correct(out.text),
                           sentence_tokens=[tokenizer.decode([ids[t]]) for t in span], distillations=rows), f, indent=1)


if __name__ == "__main__":
    main()
