# 2026-11-24, fourth session: 1M decode per preset with every refresh pattern's graph captured before timing
# (warm-up = longest refresh interval + 2 steps, timed = two longest intervals), graph GPU time per step.
wait_file /root/runs/done
O="python3 bench/offload_decode_gpu.py --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576"
run speed_1m_3k-flash $O --preset 3k-flash
run speed_1m_3k-fast $O --preset 3k-fast
run speed_1m_3k $O --preset 3k
