# The genre table at full size (docs/real-text.md, "Haystack genres"): one method's default on each genre and length,
# 30 prompts a cell (5 depths x seeds 0-2 x 2 samples), Gemma 3 270M, one GPU. A 1M cell takes ~8 minutes on an H200,
# so a session runs a share: GENRES, LENGTHS and METHOD pick it (tuning genres before held-out ones; a held-out
# genre's cells are reported, never used to choose). MODEL_DIR holds gemma.gguf (bench/device_models.py); CORPORA the
# exported texts (`python -m bench.device_corpora pack .corpora`, carried).
MODEL_DIR=${MODEL_DIR:-/root}
CORPORA=${CORPORA:-.corpora}
METHOD=${METHOD:-infinitehip}
GENRES=${GENRES:-code licenses pydoc}
LENGTHS=${LENGTHS:-1048576 131072}
FLAGS=${FLAGS:-}  # e.g. "--oracle true --trace true" (a diagnosis: selection vs reading), named by TAG
TAG=${TAG:-}
wait_file $MODEL_DIR/gemma_ready
for HAYSTACK in $GENRES; do
  for LENGTH in $LENGTHS; do
    run cell_${METHOD}${TAG}_${HAYSTACK}_$LENGTH python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --plots false --haystack-dir $CORPORA --tasks niah_single_word --method $METHOD --haystacks $HAYSTACK --lengths $LENGTH --seeds 0 1 2 --samples-per-depth 2 $FLAGS --output $OUT_DIR/cell_${METHOD}${TAG}_${HAYSTACK}_$LENGTH.json
  done
done
