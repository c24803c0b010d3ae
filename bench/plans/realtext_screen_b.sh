# Real-text needle screen (issue 16), second pass: is the oracle's reading miss dilution by strong distractors
# (smaller budgets) or incoherent fragments (wider vote pooling)? Then the dense calibration of the RULER tasks.
wait_file /root/smol.gguf
S="python3 bench/needle_screen.py --model /root/smol.gguf --model-cache-dir /root/cache --depths 0.1 0.5 0.9 --seeds 0 1"
run dense_short $S --lengths 4096 7000 --variants dense --output $OUT_DIR/screen_dense.json
run ts_oracle $S --lengths 32768 131072 --trace --oracle --variants 'tokenselect:select_tokens=256' 'tokenselect:vote_pool_size=63' 'tokenselect:select_tokens=512;vote_pool_size=63' --output $OUT_DIR/screen_ts_oracle.json
run ih_oracle $S --lengths 32768 131072 --trace --oracle --variants 'infinitehip:keep_tokens=[32768,8192,512];early_last_keep_tokens=512' --output $OUT_DIR/screen_ih_oracle.json
run calib python3 -m infinitehip.cli.main eval ruler --method dense --lengths 4096 7000 --model /root/smol.gguf --model-cache-dir /root/cache --plots false --output $OUT_DIR/ruler_dense_calibration.json
