# 2026-11-25: issue6_j's traces again, now also recording which tokens of the needle sentence the pot still
# holds (rows of 90 layer/KV-head pairs) when the question arrives.
wait_file /root/smol.gguf
S="python3 bench/infinipot_needle_trace.py --model /root/smol.gguf --model-cache-dir /root/cache --device cuda"
run trace_128k_d10 $S --length 131072 --depth 0.1 --output $OUT_DIR/ip_trace_128k_d10.json
run trace_256k_d50 $S --length 262144 --depth 0.5 --output $OUT_DIR/ip_trace_256k_d50.json
run trace_1m_d10 $S --length 1048576 --depth 0.1 --output $OUT_DIR/ip_trace_1m_d10.json
run trace_256k_d30 $S --length 262144 --depth 0.3 --output $OUT_DIR/ip_trace_256k_d30.json
