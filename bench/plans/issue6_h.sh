# 2026-11-25: candidate fixes for issue 6's passkey misses. TokenSelect: a max-pool over the votes
# (vote_pool_size, spans around the peaks), screened on the four cells that failed in the 2026-11-24 sweep
# (64K 30%, 512K 10% / 30%, 1M 10%; 1M 30% passed) and then the full 25-sample sweep with width 5.
# InfiniPot: a larger distilled size |C| = 2048 (default 1024) on its failing cells, then the full sweep.
wait_file /root/smol.gguf
S="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache"
for w in 3 5 9; do
  run ts_pool${w}_screen_long $S --method tokenselect --set vote_pool_size=$w --lengths 524288 1048576 --depths 0.1 0.3 --output $OUT_DIR/ts_pool${w}_screen_long.json
  run ts_pool${w}_screen_64k $S --method tokenselect --set vote_pool_size=$w --lengths 65536 --depths 0.3 --output $OUT_DIR/ts_pool${w}_screen_64k.json
done
run ip_c2048_screen $S --method infinipot --set compressed_tokens=2048 --lengths 131072 262144 524288 --depths 0.1 0.5 0.7 --output $OUT_DIR/ip_c2048_screen.json
run ts_pool5_sweep $S --method tokenselect --set vote_pool_size=5 --lengths 65536 131072 262144 524288 1048576 --output $OUT_DIR/passkey_tokenselect_pool5.json
run ip_c2048_sweep $S --method infinipot --set compressed_tokens=2048 --lengths 65536 131072 262144 524288 1048576 --output $OUT_DIR/passkey_infinipot_c2048.json
