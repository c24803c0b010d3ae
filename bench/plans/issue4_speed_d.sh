# 2026-11-24, fourth session: 1M decode per preset with every refresh pattern's graph captured before timing
# (warm-up = longest refresh interval + 2 steps, timed = two longest intervals), graph GPU time per step;
# then the InfiniPot passkey sweep 64K-1M x 5 depths (its first attempt died with the machine).
O="python3 bench/offload_decode_gpu.py --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576"
run speed_1m_3k-flash $O --preset 3k-flash
run speed_1m_3k-fast $O --preset 3k-fast
wait_file /root/smol.gguf
S="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache"
run infinipot_sweep $S --method infinipot --lengths 65536 131072 262144 524288 1048576 --depths 0.1 0.3 0.5 0.7 0.9 --output $OUT_DIR/passkey_infinipot.json
run speed_1m_3k $O --preset 3k
