# 2026-11-25: a held-out third sweep (seed 2, not used to pick the variant) for InfiniPot with
# novelty_fraction 0.99 + sink_tokens 4 and for the paper's defaults, 64K-1M x depths 10/30/50/70/90%.
wait_file /root/smol.gguf
S="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache --lengths 65536 131072 262144 524288 1048576 --method infinipot --seed 2"
run ip_nuc_sink_seed2 $S --set novelty_fraction=0.99 sink_tokens=4 --output $OUT_DIR/passkey_infinipot_nuc099_sink4_seed2.json
run ip_default_seed2 $S --output $OUT_DIR/passkey_infinipot_seed2.json
