# 2026-11-25: InfiniPot with novelty_fraction 0.99 + sink_tokens 4 (answered two default misses on the CPU) on the
# two 25-prompt sweeps (seed 0 and seed 1), 64K-1M x depths 10/30/50/70/90%.
wait_file /root/smol.gguf
S="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache --lengths 65536 131072 262144 524288 1048576 --method infinipot --set novelty_fraction=0.99 sink_tokens=4"
run ip_nuc_sink_seed0 $S --seed 0 --output $OUT_DIR/passkey_infinipot_nuc099_sink4_seed0.json
run ip_nuc_sink_seed1 $S --seed 1 --output $OUT_DIR/passkey_infinipot_nuc099_sink4_seed1.json
