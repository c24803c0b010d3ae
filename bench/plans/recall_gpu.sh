#!/usr/bin/env bash
# Top-k recall at 32K (paper Fig. 6) and a short passkey sweep at 64K/128K: the default vs the variants of
# docs/results/recall_study_cpu.md. Designed for < 8 min on one H100 (typical ~5; hard cap 4 x 75 s + 3 x 70 s). Prints a table last.
# Usage: bench/plans/recall_gpu.sh [MODEL.gguf|""] [OUT_DIR]    (empty model: the embedded SmolLM2-135M)
set -u
model=${1:-}; out=${2:-docs/results/recall_gpu}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's infinitehip
margs=(); [ -n "$model" ] && margs=(--model "$model")
N="--set early_pruning_rope=none --set late_pruning_rope=none"
S="--set head_aggregation=softmax"
# name | topk_recall.py overrides | passkey_sweep.py overrides (FIELD=JSON)
variants=(
  "default||"
  "softmax|$S|head_aggregation=\"softmax\""
  "none|$N|early_pruning_rope=\"none\" late_pruning_rope=\"none\""
  "none+softmax|$N $S|early_pruning_rope=\"none\" late_pruning_rope=\"none\" head_aggregation=\"softmax\""
)
for v in "${variants[@]}"; do
  IFS='|' read -r name rset pset <<< "$v"
  echo "== recall 32K passkey: $name"
  timeout 75 python3 bench/topk_recall.py "${margs[@]}" --task passkey --length 32768 --chunk 32768 --sample-rows 64 \
    $rset --output "$out/recall_${name}.json" 2>&1 | grep -E "Average|selected-part|wall" | tail -3
done
for v in "${variants[0]}" "${variants[1]}" "${variants[3]}"; do  # passkey: default, softmax, none+softmax
  IFS='|' read -r name rset pset <<< "$v"
  echo "== passkey 64K/128K: $name"
  read -r -a pset_arr <<< "$pset"  # FIELD=JSON words, quotes kept
  sets=(); [ ${#pset_arr[@]} -gt 0 ] && sets=(--set "${pset_arr[@]}")
  timeout 70 python3 bench/passkey_sweep.py "${margs[@]}" --lengths 65536 131072 --depths 0.1 0.5 0.9 --budget-s 40 \
    "${sets[@]}" --output "$out/passkey_${name}.json" 2>&1 | tail -3
done
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
print("\n| variant | recall ratio 32K | selected-part recall | passkey 64K | passkey 128K |")
print("| --- | ---: | ---: | :-: | :-: |")
for name in ("default", "softmax", "none", "none+softmax"):
    r = out / f"recall_{name}.json"
    ratio = part = "n/a"
    if r.exists():
        d = json.loads(r.read_text())
        ratio = f"{d['average_ratio']:.1%}"
        parts = [x["selected_part_recall"] for x in d["layers"].values() if x.get("selected_part_recall") is not None]
        part = f"{statistics.fmean(parts):.1%}" if parts else "n/a"
    cells = []
    p = out / f"passkey_{name}.json"
    rows = json.loads(p.read_text())["results"] if p.exists() else []
    for L in (65536, 131072):
        sel = [x for x in rows if x["length"] == L]
        cells.append(f"{sum(x['correct'] for x in sel)}/{len(sel)}" if sel else "")
    print(f"| {name} | {ratio} | {part} | {cells[0]} | {cells[1]} |")
PY
