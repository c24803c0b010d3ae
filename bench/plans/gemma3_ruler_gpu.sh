# Gemma 3 270M (hybrid layers) on the real-text suite: dense calibration at 4K/16K/32K (its trained length), each
# default method at 32K (no loss against dense) and 128K, InfiniPot's default, one 1M sample (KV memory per layer
# type in the JSON). Every RULER seed is held out (no setting was tuned on Gemma). Run by bench/detached_gpu.sh.
# The device's transformers (5.17) builds a wrong tokenizer from this GGUF (one id per character, no BOS; the
# conversion now refuses it): before these runs the converted directory's tokenizer files were replaced by the ones
# transformers 5.24 writes (`infinitehip/model/gguf_convert.py` output on the dev machine), carried over.
wait_file /root/gemma.gguf
G="python3 -m infinitehip.cli.main eval ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --haystacks essays --plots false --tasks niah_single_word"
run g_dense $G --method dense --lengths 4096 16384 32000 --samples-per-depth 1 --output $OUT_DIR/gemma_dense.json
run g_ih $G --method infinitehip --lengths 32000 131072 --samples-per-depth 1 --trace true --output $OUT_DIR/gemma_infinitehip.json
run g_ts $G --method tokenselect --lengths 32000 131072 --samples-per-depth 1 --trace true --output $OUT_DIR/gemma_tokenselect.json
run g_pot $G --method infinipot --lengths 32000 131072 --samples-per-depth 1 --output $OUT_DIR/gemma_infinipot.json
run g_1m $G --method infinitehip --lengths 1048576 --depths 0.5 --seeds 2 --samples-per-depth 1 --output $OUT_DIR/gemma_infinitehip_1m.json
