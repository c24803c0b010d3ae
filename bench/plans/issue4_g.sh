# 2026-11-24, fourth session, last machine: 2M and 512K decode (3k-flash) again with the bench's default warm-up
# (every refresh pattern captured before timing), as the 1M rows were.
O="python3 bench/offload_decode_gpu.py --graph-times --fast-prefill --preset 3k-flash"
run speed_2m_3k-flash $O --contexts 2097152 --kv-dtype fp8_e4m3 --mask-bank-tokens 131072
run speed_512k_3k-flash $O --contexts 524288
