# Where the two overhead-bound paths spend their time, 8B-shaped model (RANDOM bf16 weights), infinitehip default, one
# GPU (~8 minutes): a prefix-cache hit's second question at 128K resident (kernel and host-op tables, host sync
# sites), then decode at 1M with the KV offloaded (FP8 store; graph replay times by refresh pattern, kernel table of
# the last steps). The profiled request and steps are slowed by the profiler: their times are not headline figures.
#   bench/detached_gpu.sh start bench/plans/profile_hot_paths.sh DIR; then bench/detached_gpu.sh poll DIR SECS
run prefix_profile python3 -m bench prefix-ttft --preset default --warmup-tokens 65536 --resident 131072 --kv-dtype fp8_e4m3 --profile --profile-rows 40 --output $OUT_DIR/prefix_profile.json
run decode_profile python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --profile-steps 24 --profile-rows 45 --output $OUT_DIR/decode_profile.json
