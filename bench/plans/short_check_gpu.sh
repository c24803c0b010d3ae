# infinitehip's default against dense at 4K/7K on Gemma 3 270M (no loss within the trained length), essays, code
# word; dense's cells are in the calibration run. Run by bench/detached_gpu.sh after .gguf/gemma_prep.sh.
wait_file /root/gemma_ready
G="python3 -m infinitehip.cli.main eval ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --haystacks essays --plots false --tasks niah_single_word"
run short_ih $G --method infinitehip --lengths 4096 7000 --samples-per-depth 2 --output $OUT_DIR/gemma_short_infinitehip.json
