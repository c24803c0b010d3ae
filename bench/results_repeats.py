"""The question's vote with repeated text left out (`repeat_span`, attention/repeated_text.py), screened at 1M on
docs/results.md beside each method's default on the same prompts."""

from __future__ import annotations

from results_common import D26, D27, RESULTS, cell
from results_tables import GEMMA, VARY, file_rows

REPEAT = D27 + "gpu_repeat/"
CONFIG = '{"repeat_span": 32}'


def repeat_span_markdown() -> str:
    if not (RESULTS / REPEAT / "ih_rs32_essays1m.json").exists():
        return ""
    ih_essays = [(file_rows(VARY, "ih_vary_1m.json", (0, 1)), file_rows(REPEAT, "ih_rs32_essays1m.json", (0, 1))),
                 (file_rows(VARY, "ih_vary_1m.json", (2,)), file_rows(REPEAT, "ih_rs32_essays1m_s2.json", (2,)))]
    ih_sotu = (file_rows(D26 + "gpu_sotu/", "sotu_ih_1m.json", (0, 1)), file_rows(REPEAT, "ih_rs32_sotu1m.json", (0, 1)))
    ts_essays = (file_rows(D26 + "gpu_ts_question/", "ts_q512_essays1m.json", (0, 1)),
                 file_rows(REPEAT, "ts_rs32_essays1m.json", (0, 1)))
    cmd = f"{GEMMA} --method infinitehip --lengths 1048576 --seeds 0 1 --method-config '{CONFIG}'"
    lines = ["## Repeated text left out of the question's vote (`repeat_span`), screened at 1M", "",
             "Device: NVIDIA H100 80GB, bf16. Date: 2026-11-27. Gemma 3 270M, 1M, each sample in its own text "
             f"(`{cmd}`; `--seeds 2`, `--haystacks sotu`, `--method tokenselect` for the other cells). With "
             "`repeat_span` 32 a token inside a 32-token window that occurred earlier in the prompt gets no question "
             "vote, so the question's budget holds the first copy of a repeated passage only. A 1M essays prompt holds "
             "the corpus ~7 times (85% of its tokens are marked); a 1M sotu prompt 0.3-0.7% (speeches quoting "
             "earlier ones), a 128K sotu prompt none. The span was fixed before the run, not tuned; code of commit "
             "b92f686 (later the same day chunks whose every token repeats were also left out of the budget, so a "
             "passkey's filler leaves it unused: not run on the GPU; here the budget's 128 chunks come from the "
             "first copy's ~9,600 either way). Defaults: the "
             "rows of the tables above, same prompts, 2026-11-26 (the default repeats its answers output for output "
             "across machines: the question-time settings section).", "",
             "| method | setting | essays 1M, seeds 0-1 | essays 1M, seed 2 (held out) | sotu 1M, seeds 0-1 |",
             "| --- | --- | :-: | :-: | :-: |",
             f"| infinitehip | default | {cell(ih_essays[0][0])} | {cell(ih_essays[1][0])} | {cell(ih_sotu[0])} |",
             f"| infinitehip | `{CONFIG}` | {cell(ih_essays[0][1])} | {cell(ih_essays[1][1])} | {cell(ih_sotu[1])} |",
             f"| tokenselect | default | {cell(ts_essays[0])} | – | – |",
             f"| tokenselect | `{CONFIG}` | {cell(ts_essays[1])} | – | – |"]
    swaps = []
    for label, pairs in (("infinitehip, essays", ih_essays), ("infinitehip, sotu", [ih_sotu]),
                          ("tokenselect, essays", [ts_essays])):
        up = down = 0
        for before, after in pairs:
            old = {(r["depth"], r["seed"]): r["correct"] for r in before}
            for r in after:
                key = (r["depth"], r["seed"])
                up += key in old and r["correct"] and not old[key]
                down += key in old and old[key] and not r["correct"]
        swaps.append(f"{label} {up} miss -> right, {down} right -> miss")
    lines += ["", f"Prompt by prompt: {'; '.join(swaps)}. Not taken as a default: `infinitehip` reads two essays "
              "prompts more of 30 (one on the choosing seeds, one held out; swaps as above), "
              "`tokenselect` loses two it read, and the passkey (whose filler is one repeated sentence, so nearly "
              "all of it is marked) was not run in this session's device time. The setting stays as a study knob "
              "(`--help-all`), off."]
    return "\n".join(lines) + "\n"
