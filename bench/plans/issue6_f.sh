# 2026-11-24, fourth session, third machine: TokenSelect's depth-10% misses at 512K / 1M. Is it the Triton
# scoring (impl=reference: the eager oracle for scoring and attention) or the 2,048-token budget being crowded
# out (select_tokens=4096)?
wait_file /root/smol.gguf
S="python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache --method tokenselect --depths 0.1"
run ts_k4096 $S --set select_tokens=4096 --lengths 524288 1048576 --output $OUT_DIR/passkey_tokenselect_k4096_d10.json
run ts_reference $S --set 'impl="reference"' --lengths 524288 1048576 --output $OUT_DIR/passkey_tokenselect_reference_d10.json
