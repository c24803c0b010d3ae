# 2026-11-24, fourth session, second machine: the 1M offloaded decode with the layer-wise dense comparison in
# the same run; TokenSelect's sweep again (the first run's JSON died with its machine) and with the Selection
# Cache off at 512K / 1M (where it missed); InfiniPot with the question-aware catalyst (CaP-Q).
run speed_1m_3k-flash_dense python3 bench/offload_decode_gpu.py --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset 3k-flash --dense-layerwise
wait_file /root/smol.gguf
S="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache"
run tokenselect_sweep $S --method tokenselect --lengths 65536 131072 262144 524288 1048576 --output $OUT_DIR/passkey_tokenselect.json
run tokenselect_nocache $S --method tokenselect --set selection_cache=false --lengths 524288 1048576 --output $OUT_DIR/passkey_tokenselect_nocache.json
run infinipot_capq $S --method infinipot --set 'catalyst_question="What is the pass key?"' --lengths 65536 131072 262144 524288 1048576 --output $OUT_DIR/passkey_infinipot_capq.json
