# The kernels' CUDA tests: each Triton op against its eager reference on the GPU (the CPU suite runs them under the
# interpreter, which does not compile them). Minutes; first in a plan list, so a kernel that fails to compile shows
# before the benchmarks that use it; dense's decode replayed from real CUDA graphs against eager (test_auto.py), and
# several sequences' decode in one real CUDA graph against each decoded alone (test_batch_graphs.py), the graph
# decodes of tokenselect and cascade, steps launched ahead from real graphs, the prefill saliency kernel, and the
# top-chunks and chunk-merge kernels' batched rows (refresh flags, limits, pool rows), and an offloaded batch from
# one real graph (no Python at a replay: the banks' holders) against the resident tokens. (The other decode-ahead tests
# need the embedded model's tokenizer, which the GPU image lacks; they run on the CPU.)
run kernel_tests timeout 600 python3 -m pytest -q -p no:cacheprovider -x tests/attention/test_dense_paged_decode.py tests/attention/test_sparse_attention.py tests/attention/test_auto.py tests/engine/test_batch_graphs.py tests/attention/test_window_saliency.py tests/attention/test_landmark_kernels.py tests/attention/test_tokenselect_graphs.py tests/attention/test_cascade_graphs.py tests/attention/test_topchunks.py tests/attention/test_chunk_merge.py tests/engine/test_decode_ahead.py::test_real_cuda_graphs_launched_ahead_decode_the_same_tokens tests/engine/test_offload_engine.py::test_an_offloaded_batch_from_one_real_cuda_graph_decodes_the_resident_tokens
