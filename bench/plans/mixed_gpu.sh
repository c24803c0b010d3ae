# One H100 session: prefix caching's second-question TTFT (128K resident, 1M offloaded, real prefill), our
# InfiniteHiP vs the authors' hip-attn on one layer, then Gemma 3 270M real-text cells with the current code (the
# saliency formulation changed: 128K re-run against the previous 27/30; 512K at 30 samples; 1M seed 1).
python3 -m pip install -q --no-deps --no-index --target /tmp/hip .whl/hip/hip_attn-1.2.9-py3-none-any.whl
run prefix_ttft python3 bench/prefix_ttft_gpu.py --preset default --warmup-tokens 65536 --resident 131072 --offloaded 1048576 --kv-dtype fp8_e4m3 --out $OUT_DIR/prefix_ttft.json
run hip_attn python3 bench/hip_attn_compare.py --hip-path /tmp/hip --contexts 131072 262144 524288 1048576 --output $OUT_DIR/hip_attn.json
wait_file /root/gemma_ready
G="python3 -m infinitehip.cli.main eval ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --haystacks essays --plots false --tasks niah_single_word"
run g_ih_128k $G --method infinitehip --lengths 131072 --samples-per-depth 2 --output $OUT_DIR/gemma_128k_infinitehip.json
run g_ih_512k $G --method infinitehip --lengths 524288 --samples-per-depth 2 --output $OUT_DIR/gemma_512k_infinitehip.json
run g_ts_512k $G --method tokenselect --lengths 524288 --samples-per-depth 2 --output $OUT_DIR/gemma_512k_tokenselect.json
run g_ih_1m $G --method infinitehip --lengths 1048576 --seeds 1 --samples-per-depth 1 --output $OUT_DIR/gemma_1m_infinitehip_s1.json
run g_ts_1m $G --method tokenselect --lengths 1048576 --seeds 1 --samples-per-depth 1 --output $OUT_DIR/gemma_1m_tokenselect_s1.json
