# 2026-11-25: TokenSelect single-layer latency with the new default vote_pool_size 5 (the max-pool runs on
# every selection), then InfiniPot with more of |C| for NuC (novelty_fraction 0.75) over the full sweep.
run ts_latency python3 bench/tokenselect_latency.py --steps 100
wait_file /root/smol.gguf
S="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache"
run ip_a075_sweep $S --method infinipot --set novelty_fraction=0.75 --lengths 65536 131072 262144 524288 1048576 --output $OUT_DIR/passkey_infinipot_a075.json
