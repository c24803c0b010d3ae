# Screens settings of one method against its default in the same run, on the two checks a default must pass: the
# real-text suite's choosing prompts (Gemma 3 270M, each of HAYSTACKS at LENGTH, seeds SEEDS; report the other seeds
# as held out) and the embedded model's passkey (SmolLM2, 64K-1M x 5 depths, seeds 0 and 1; passkey results must not
# drop).
# SETTINGS: a file of lines "NAME JSON" (the method's fields, --method-config), e.g.
#   default {}
#   q512 {"question_select_tokens": 512}
# (METHOD=infinitehip: its fields, e.g. q512 {"question_keep_tokens": 512}; the run that chose tokenselect's
# question budget: docs/devlog.md, "TokenSelect").
# MODEL_DIR holds smol.gguf and gemma.gguf with its conversion cache, carried by bench/device_models.py (which touches
# smol_ready / gemma_ready). Passkey first: the SmolLM2 parts are the first to arrive.
MODEL_DIR=${MODEL_DIR:-/root}
METHOD=${METHOD:-tokenselect}
HAYSTACKS=${HAYSTACKS:-sotu}
LENGTH=${LENGTH:-1048576}
SEEDS=${SEEDS:-0 1}
mapfile -t LINES < "$SETTINGS"
# The two models are small and latency-bound: the passkey stream runs beside the Gemma stream on the one GPU
# (SmolLM2's 1M KV ~23 GB, Gemma 3 270M's ~18 GB).
(
  wait_file $MODEL_DIR/smol_ready
  for line in "${LINES[@]}"; do
    name=${line%% *}; json=${line#* }
    for seed in 0 1; do
      run passkey_${name}_s$seed python3 -m bench accuracy --model $MODEL_DIR/smol.gguf --method $METHOD --lengths 65536 131072 262144 524288 1048576 --seed $seed --method-config "$json" --output $OUT_DIR/passkey_${name}_s$seed.json
    done
  done
) &
wait_file $MODEL_DIR/gemma_ready
for haystack in $HAYSTACKS; do
  for line in "${LINES[@]}"; do
    name=${line%% *}; json=${line#* }
    run ruler_${name}_$haystack python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --prefill-chunk-size 32768 --plots false --tasks niah_single_word --method $METHOD --haystacks $haystack --lengths $LENGTH --seeds $SEEDS --method-config "$json" --output $OUT_DIR/ruler_${name}_$haystack.json
  done
done
wait
