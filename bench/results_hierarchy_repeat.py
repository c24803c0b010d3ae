"""Repeated text left out of infinitehip's pruning stages (`hierarchy_repeat_span`, the default since 2026-11-27):
the default before and after on the same prompts, and the question's vote left out on top of it (screened)."""

from __future__ import annotations

import json

from results_common import D27, RESULTS, passkey_rows
from results_repeats import PASSKEY, _pair, turn_table
from results_tables import GEMMA, SOTU, TS, VARY, file_rows

HREP = D27 + "gpu_hierarchy_repeat/"
CHECK = D27 + "gpu_repeat_check/"  # the default's passkey sweep of 2026-11-27 before the change
OFF = '{"hierarchy_repeat_span": 0}'
BOTH = '{"repeat_span": 32}'


def _h(name: str, seeds: tuple[int, ...], length: int | None = None) -> list[dict]:
    return file_rows(HREP, name, seeds, length)


def hierarchy_repeat_markdown() -> str:
    if not (RESULTS / HREP / "ruler_ih_hrep32_essays1m_s01.json").exists():
        return ""
    rows = [
        ("essays 1M, seeds 0-1 (chose it)", "same run", _pair(_h("ruler_ih_default_essays1m_s01.json", (0, 1)),
                                                               _h("ruler_ih_hrep32_essays1m_s01.json", (0, 1)))),
        ("essays 1M, seed 2 (held out)", "same run", _pair(_h("ruler_ih_default_essays1m_s2.json", (2,)),
                                                           _h("ruler_ih_hrep32_essays1m_s2.json", (2,)))),
        ("essays 512K, seeds 0-1 (chose it)", "same run", _pair(_h("ruler_ih_default_essays512k_s01.json", (0, 1)),
                                                                 _h("ruler_ih_hrep32_essays512k_s01.json", (0, 1)))),
        ("essays 512K, seed 2 (held out)", "same run", _pair(_h("ruler_ih_default_essays512k_s2.json", (2,)),
                                                             _h("ruler_ih_hrep32_essays512k_s2.json", (2,)))),
        ("essays 128K, seeds 0-2", "2026-11-26", _pair(file_rows(VARY, "ih_vary_128k.json", (0, 1, 2)),
                                                       _h("ruler_ih_hrep32_essays128k.json", (0, 1, 2)))),
        ("essays 32K, seeds 0-2", "2026-11-26", _pair(file_rows(VARY, "ih_vary_32k_64k.json", (0, 1, 2), 32000),
                                                      _h("ruler_ih_hrep32_essays32k_64k.json", (0, 1, 2), 32000))),
        ("essays 64K, seeds 0-2", "2026-11-26", _pair(file_rows(VARY, "ih_vary_32k_64k.json", (0, 1, 2), 65536),
                                                      _h("ruler_ih_hrep32_essays32k_64k.json", (0, 1, 2), 65536))),
        ("sotu 1M, seeds 0-1", "2026-11-26", _pair(file_rows(SOTU, "sotu_ih_1m.json", (0, 1)),
                                                   _h("ruler_ih_hrep32_sotu1m_s01.json", (0, 1)))),
        ("sotu 1M, seed 2", "2026-11-26", _pair(file_rows(SOTU, "sotu_ih_1m.json", (2,)),
                                                _h("ruler_ih_hrep32_sotu1m_s2.json", (2,)))),
        ("sotu 512K, seeds 0-2", "2026-11-26", _pair(file_rows(TS, "ih_sotu_512k.json", (0, 1, 2)),
                                                     _h("ruler_ih_hrep32_sotu512k.json", (0, 1, 2)))),
        ("passkey 64K-1M, seeds 0-1 (SmolLM2)", "2026-11-27", _pair(passkey_rows(CHECK, "passkey_ih_default"),
                                                                     passkey_rows(HREP, "passkey_ih_hrep32"))),
    ]
    cmd = f"{GEMMA} --method infinitehip --lengths 1048576 --seeds 0 1"
    lines = ["## Repeated text left out of the pruning stages (`hierarchy_repeat_span`), the default since 2026-11-27", "",
             "Device: NVIDIA H100 80GB, bf16, torch 2.11, triton 3.6 (two machines the same day). Date: 2026-11-27: the "
             "first machine ran commit 65d71da with `--method-config '{\"hierarchy_repeat_span\": 32}'` against the "
             "default of the day, the second (the screen below) commit 2aec05f, where 32 is the default. "
             "Why: at 1M the essays hold the corpus ~7 times and the pruning stages score every copy of a passage "
             "alike (keys are scored position-free), so the answer attended each distractor passage once per copy "
             "(seven times the attention mass of the needle, which occurs once); the 1M misses were reading misses "
             "with the needle attended (the section on selection or reading below). Now at the prompt's last chunk "
             "and in decode a stage-1 chunk (256 tokens) whose every token lies in a 32-token window seen earlier in "
             "the prompt is no candidate: the stages keep one copy of a repeated passage. The span is the question "
             "vote's of the screen below, fixed before the run; the choice was made on seeds 0-1 of the essays at "
             "512K and 1M, seed 2 held out. Commands: "
             f"`{cmd} --method-config '{{\"hierarchy_repeat_span\": 32}}'` (`--lengths 524288`, `--seeds 2`, "
             "`--haystacks sotu` for the other cells; today the default needs no config), the before with "
             f"`--method-config '{OFF}'` (it ran as the default of its day); passkey: `{PASSKEY}` (and `--seed 1`). "
             "Cells compare the same prompts.", "",
             *turn_table("before ran", "before (`hierarchy_repeat_span` 0)", "default (32)", rows)]
    lines += ["", "Text that never repeats is selected exactly as before: no stage-1 chunk of the 120 sotu "
              "prompts of 7K-128K in the first table is all repeated text (35 of them hold some tokens in a repeated "
              "32-token window, speeches quoting earlier ones, never a whole chunk; on the CPU, `python -m "
              "bench.repeat_chunks` with the three files of those cells, log `2026-11-27/cpu/sotu_repeat_chunks.log`), "
              "so those cells stand as run. Speed: the mask is one sort of the prompt's window hashes "
              "at its last chunk and one select per stage-1 refresh; the 1M decode table below is re-measured "
              "with it.", ""]
    both = [("essays 1M, seeds 0-1", _pair(_h("ruler_ih_hrep32_essays1m_s01.json", (0, 1)),
                                           _h("ruler_ih_hrep32_rs32_essays1m_s01.json", (0, 1)))),
            ("essays 512K, seeds 0-1", _pair(_h("ruler_ih_hrep32_essays512k_s01.json", (0, 1)),
                                             _h("ruler_ih_hrep32_rs32_essays512k_s01.json", (0, 1)))),
            ("passkey 64K-1M, seeds 0-1", _pair(passkey_rows(HREP, "passkey_ih_hrep32"),
                                                passkey_rows(HREP, "passkey_ih_hrep32_rs32")))]
    lines += [f"The question's vote with repeated text left out too (`--method-config '{BOTH}'` on the new default, "
              "screened on seeds 0-1, second machine):", "",
              "| cell | default | with the question's vote left out too | miss -> right / right -> miss |",
              "| --- | :-: | :-: | :-: |"]
    lines += [f"| {name} | {a} | {b} | {turn} |" for name, (a, b, turn) in both]
    lines += ["", "Not taken on this screen alone (one passkey prompt more and the real-text cells level, one 512K prompt "
              "each way, is within what a rerun turns); taken after the held-out check of the next section."]
    return "\n".join(lines + _misses_lines()) + "\n"


def _misses_lines() -> list[str]:
    """The default's essays misses at 512K and 1M re-run with the needle trace and with the needle forced in."""
    runs = {mode: [r for f in sorted((RESULTS / HREP).glob(f"ruler_ih_{mode}_essays*_misses*.json"))
                   for r in json.loads(f.read_text())["samples"]] for mode in ("trace", "oracle")}
    if not runs["trace"]:
        return []
    key = lambda r: (r["length"], r["seed"], r["depth"], r.get("haystack_start"))
    default = {key(r): r for n in ("essays512k_s01", "essays512k_s2", "essays1m_s01", "essays1m_s2")
               for r in json.loads((RESULTS / HREP / f"ruler_ih_hrep32_{n}.json").read_text())["samples"]}
    misses = [r for r in runs["trace"] if not default[key(r)]["correct"]]
    oracle = {key(r): r for r in runs["oracle"]}
    same = sum(bool(r["correct"]) == bool(default[key(r)]["correct"]) for r in runs["trace"])
    found = sum(r["needle_trace"]["prefill_mean"].get("question", 0) >= 0.999 for r in misses)
    whole = sum(r["needle_trace"]["prefill_mean"].get("attended", 0) >= 0.999
                and min(r["needle_trace"]["decode_step_min"]) >= 0.999 for r in misses)
    read = sum(bool(oracle[key(r)]["correct"]) for r in misses if key(r) in oracle)
    cmd = (f"{GEMMA} --method infinitehip --lengths 1048576 --seeds 2 --depths 0.1 0.3 --trace true` (and "
           "`--oracle true`; 512K: `--lengths 524288 --seeds 0 --depths 0.1 0.7`, `--seeds 2 --depths 0.1`")
    return ["", "**The default's remaining misses are reading misses.** Its 5 essays misses at 512K and 1M (the table "
            f"above) with the other prompt of their cells, re-run with the needle trace (`{cmd}; one H100, "
            f"2026-11-27, commit 2aec05f): the trace run gives the default's answer on {same} of "
            f"{len(runs['trace'])} prompts; in {found} of {len(misses)} misses question-time selection holds the "
            f"whole needle, {whole} of {len(misses)} attend every needle token at the prompt's last query block and at "
            f"every answer step, and with the needle forced into every layer's selection {read} of {len(misses)} are "
            "read. What they answer: a phrase of the essays (\"the secret weapon\", \"do what you love\"), the "
            "question's own words, or the code word without its hyphen (\"pepper 7334\")."]
