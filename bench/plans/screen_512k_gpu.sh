# One H100 machine: prefix caching's second-question TTFT (128K resident, 1M offloaded), then Gemma 3 270M at 512K
# (its weak length): infinitehip variants on seeds 0-1 with the needle trace, the winner on held-out seed 2 and at
# 128K, then the SmolLM2 passkey sweep (the prefill speed work's regression check).
# Needs /root/gemma.gguf (+ /root/gemma_ready) and /root/smol.gguf carried in parts (bench/detached_gpu.sh).
run prefix_ttft python3 -m bench prefix-ttft --preset default --warmup-tokens 65536 --resident 131072 --offloaded 1048576 --kv-dtype fp8_e4m3 --output $OUT_DIR/prefix_ttft.json
wait_file /root/gemma_ready
G="python3 -m infinitehip.cli.main eval ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --haystacks essays --plots false --tasks niah_single_word --trace true"
S="--lengths 524288 --seeds 0 1 --samples-per-depth 2"
run ih_base $G --method infinitehip $S --output $OUT_DIR/ih_base.json
run ih_last1k $G --method infinitehip $S --method-config '{"keep_tokens": [32768, 8192, 1024]}' --output $OUT_DIR/ih_last1k.json
run ih_q4k $G --method infinitehip $S --method-config '{"question_keep_tokens": 4096}' --output $OUT_DIR/ih_q4k.json
run ih_q1k $G --method infinitehip $S --method-config '{"question_keep_tokens": 1024}' --output $OUT_DIR/ih_q1k.json
run ih_stream512 $G --method infinitehip $S --method-config '{"stream_tokens": 512}' --output $OUT_DIR/ih_stream512.json
run ih_qwin17 $G --method infinitehip $S --method-config '{"question_window": 17}' --output $OUT_DIR/ih_qwin17.json
python3 bench/pick_setting.py \
  "base=$OUT_DIR/ih_base.json=" \
  "last1k=$OUT_DIR/ih_last1k.json=--method-config {\"keep_tokens\":[32768,8192,1024]}" \
  "q4k=$OUT_DIR/ih_q4k.json=--method-config {\"question_keep_tokens\":4096}" \
  "q1k=$OUT_DIR/ih_q1k.json=--method-config {\"question_keep_tokens\":1024}" \
  "stream512=$OUT_DIR/ih_stream512.json=--method-config {\"stream_tokens\":512}" \
  "qwin17=$OUT_DIR/ih_qwin17.json=--method-config {\"question_window\":17}" > $OUT_DIR/winner.args 2> $OUT_DIR/pick.log
W=$(cat $OUT_DIR/winner.args)
run ih_win_s2 $G --method infinitehip --lengths 524288 --seeds 2 --samples-per-depth 2 $W --output $OUT_DIR/ih_win_s2.json
run ih_win_128k $G --method infinitehip --lengths 131072 --samples-per-depth 2 $W --output $OUT_DIR/ih_win_128k.json
wait_file /root/smol_ready
run passkey timeout 420 python3 -m bench accuracy --model /root/smol.gguf --model-cache-dir /root/cache --method infinitehip --lengths 65536 131072 262144 524288 1048576 --output $OUT_DIR/passkey_default.json
