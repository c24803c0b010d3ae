# The Cascading KV Cache and HiP v1 on one GPU (~20 minutes), every baseline in the same run. Random Llama-3-8B-shaped
# bf16 weights (`--model random8b`) for memory and speed; the embedded SmolLM2 for the passkey; Gemma 3 270M for the
# real-text suite (MODEL_DIR holds gemma.gguf, bench/device_models.py; CORPORA the exported texts).
# Rows of docs/results.md (file each JSON with `python -m bench.report add`).
# The embedded SmolLM2 travels as a model too (the GPU machine lacks its package): carry .gguf/smol.part0* and run
# `python3 -m bench.device_models join MODEL_DIR smol` after the last part, as for Gemma.
MODEL_DIR=${MODEL_DIR:-/root}
CORPORA=${CORPORA:-.corpora}
wait_file $MODEL_DIR/smol_ready
# KV memory constant in the input length: cascade (paper preset) beside streaming and InfiniPot at 32K-1M.
run mem_cascade python3 -m bench memory --tokenizer-model $MODEL_DIR/smol.gguf --model-cache-dir $MODEL_DIR/cache --method cascade --preset paper --lengths 32768 131072 1048576 --model random8b --prefill-chunk-size 1024 --output $OUT_DIR/memory_cascade.json
run mem_streaming python3 -m bench memory --tokenizer-model $MODEL_DIR/smol.gguf --model-cache-dir $MODEL_DIR/cache --method streaming --window-tokens 16316 --lengths 32768 131072 1048576 --model random8b --prefill-chunk-size 1024 --output $OUT_DIR/memory_streaming.json
run mem_infinipot python3 -m bench memory --tokenizer-model $MODEL_DIR/smol.gguf --model-cache-dir $MODEL_DIR/cache --method infinipot --lengths 32768 131072 1048576 --model random8b --prefill-chunk-size 1024 --output $OUT_DIR/memory_infinipot.json
run decode python3 -m bench decode --contexts 131072 1048576 --methods dense cascade:paper streaming --output $OUT_DIR/decode_cascade.json
# The whole 8B-shaped model: HiP v1's decode from CUDA graphs (one sequence at 127K, within the trained length it
# keeps; eight at 32K in one graph) beside dense and infinitehip's default.
run decode_hip python3 -m bench decode --contexts 130048 --methods dense hip infinitehip --output $OUT_DIR/decode_hip.json
run batch_hip python3 -m bench batch-decode --model random8b --contexts 32768 --batch-sizes 1 8 --methods hip --warmup-steps 16 --output $OUT_DIR/batch_decode_hip.json
# One layer: HiP v1 vs infinitehip's default vs dense SDPA-flash (prefill chunk, decode).
run hip_latency python3 -m bench method-latency --contexts 131072 1048576 --methods hip infinitehip:default --output $OUT_DIR/method_latency_hip.json
# Accuracy: passkey on the embedded model, cascade (a 64K cache) vs streaming at the same size; hip at 32K-128K.
run passkey_cascade python3 -m bench accuracy --model $MODEL_DIR/smol.gguf --model-cache-dir $MODEL_DIR/cache --method cascade --preset paper-65k --lengths 32768 131072 1048576 --output $OUT_DIR/passkey_cascade.json
run passkey_streaming python3 -m bench accuracy --model $MODEL_DIR/smol.gguf --model-cache-dir $MODEL_DIR/cache --method streaming --sink-tokens 64 --window-tokens 65472 --lengths 32768 131072 1048576 --output $OUT_DIR/passkey_streaming.json
run passkey_hip python3 -m bench accuracy --model $MODEL_DIR/smol.gguf --model-cache-dir $MODEL_DIR/cache --method hip --lengths 32768 131072 --output $OUT_DIR/passkey_hip.json
wait_file $MODEL_DIR/gemma_ready
G="python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --prefill-chunk-size 32768 --plots false --haystack-dir $CORPORA --tasks niah_single_word --seeds 0 --samples-per-depth 1 --haystacks sotu essays code"
run ruler_hip $G --method hip --dense-layers 0 --lengths 32000 131072 --output $OUT_DIR/ruler_hip.json
run ruler_cascade $G --method cascade --lengths 32000 131072 --output $OUT_DIR/ruler_cascade.json
run ruler_streaming $G --method streaming --lengths 32000 131072 --output $OUT_DIR/ruler_streaming.json
# Whole-model prefill at 128K and 1M: cascade vs streaming at the same cache vs dense (layer-wise where it does not fit).
run prefill python3 -m bench prefill --contexts 131072 1048576 --methods cascade streaming dense --cascade-preset paper --chunk 1024 --dense-layerwise --output $OUT_DIR/prefill_cascade.json
