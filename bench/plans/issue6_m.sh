# 2026-11-25: a second, independent 25-prompt sweep (base seed 1: other pass keys, same filler) for tokenselect
# (vote pooling, the new default) and infinipot (default), to see how far the first sweep's rates carry.
wait_file /root/smol.gguf
S="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache --seed 1 --lengths 65536 131072 262144 524288 1048576"
run ts_seed1 $S --method tokenselect --output $OUT_DIR/passkey_tokenselect_seed1.json
run ip_seed1 $S --method infinipot --output $OUT_DIR/passkey_infinipot_seed1.json
