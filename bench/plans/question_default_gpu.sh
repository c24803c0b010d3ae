# Question-time selection as infinitehip's default: speed and accuracy in one device session (bench/detached_gpu.sh).
# Candidate default: 3k-fast-question with 16-token final chunks (--chunk-sizes 256 32 16: the passkey sweep's
# 25/25 setting). Baselines in the same run: dense SDPA (one layer), the paper's 3k and 3k-fast (one layer).
# Needs the SmolLM2 GGUF at /root/smol.gguf and Gemma 3's at /root/gemma.gguf, converted into /root/cache with a
# working tokenizer before /root/gemma_ready appears: the device's transformers (5.17) builds a broken Gemma tokenizer
# from the GGUF, which the converter refuses, so the tokenizer files a newer transformers writes are copied in.
run lat python3 bench/attention_latency.py --contexts 131072 1048576 --presets 3k 3k-fast 3k-fast-question 3k-question --skip-prefill --budget-s 1 --output $OUT_DIR/attention_latency.json
wait_file /root/smol.gguf
P="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache --method infinitehip --preset 3k-fast-question --set chunk_sizes=[256,32,16]"
run pk $P --lengths 65536 131072 262144 524288 --output $OUT_DIR/passkey_question.json
wait_file /root/gemma_ready
G="python3 -m infinitehip.cli.main eval ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --haystacks essays --plots false --trace true"
Q="--method infinitehip --preset 3k-fast-question --chunk-sizes 256 32 16"
run g_q $G $Q --tasks niah_single_word --lengths 32000 131072 --samples-per-depth 2 --output $OUT_DIR/gemma_infinitehip_question.json
cp docs/results/2026-11-25/realtext/gemma3/gemma_tokenselect.json $OUT_DIR/gemma_tokenselect.json
run g_ts $G --method tokenselect --tasks niah_single_word --lengths 32000 131072 --samples-per-depth 2 --output $OUT_DIR/gemma_tokenselect.json
run g_mk_q $G $Q --tasks niah_multikey --lengths 131072 --samples-per-depth 2 --output $OUT_DIR/gemma_multikey_infinitehip_question.json
run g_mk_ts $G --method tokenselect --tasks niah_multikey --lengths 131072 --samples-per-depth 2 --output $OUT_DIR/gemma_multikey_tokenselect.json
run off python3 bench/offload_decode_gpu.py --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset 3k-fast-question --set chunk_sizes=[256,32,16] --dense-layerwise
run g_a $G --method infinitehip --preset 3k-fast-question --tasks niah_single_word --lengths 32000 131072 --samples-per-depth 1 --output $OUT_DIR/gemma_infinitehip_question8.json
run g_long_q $G $Q --tasks niah_single_word --lengths 524288 --samples-per-depth 1 --seeds 2 --output $OUT_DIR/gemma_long_infinitehip_question.json
run g_long_ts $G --method tokenselect --tasks niah_single_word --lengths 524288 --samples-per-depth 1 --seeds 2 --output $OUT_DIR/gemma_long_tokenselect.json
run pk1m $P --lengths 1048576 --depths 0.1 0.5 0.9 --output $OUT_DIR/passkey_question_1m.json
