# Real-text needle screen (issue 16): defaults with trace + oracle at 32K/128K, then variants at 128K.
wait_file /root/smol.gguf
S="python3 bench/needle_screen.py --model /root/smol.gguf --model-cache-dir /root/cache --depths 0.1 0.5 0.9 --seeds 0 1"
run defaults $S --lengths 32768 131072 --trace --oracle --variants tokenselect infinitehip --output $OUT_DIR/screen_defaults.json
run ts_variants $S --lengths 131072 --trace --variants 'tokenselect:vote_logits="raw"' 'tokenselect:question_tokens=64' 'tokenselect:vote_pool_size=1' 'tokenselect:select_tokens=8192' --output $OUT_DIR/screen_ts.json
run ih_variants $S --lengths 131072 --trace --variants 'infinitehip:head_aggregation="softmax"' 'infinitehip/5k' 'infinitehip:chunk_sizes=[64,16,4];keep_tokens=[32768,8192,2048];early_last_keep_tokens=4096' --output $OUT_DIR/screen_ih.json
