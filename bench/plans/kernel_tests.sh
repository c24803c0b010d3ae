# The kernels' CUDA tests: each Triton op against its eager reference on the GPU (the CPU suite runs them under the
# interpreter, which does not compile them). Minutes; first in a plan list, so a kernel that fails to compile shows
# before the benchmarks that use it; dense's decode replayed from real CUDA graphs against eager (test_auto.py), and
# several sequences' decode in one real CUDA graph against each decoded alone (test_batch_graphs.py), the graph
# decodes not yet run on a GPU (tokenselect, cascade, decode ahead) and the prefill saliency kernel.
run kernel_tests timeout 600 python3 -m pytest -q -p no:cacheprovider -x tests/attention/test_dense_paged_decode.py tests/attention/test_sparse_attention.py tests/attention/test_auto.py tests/engine/test_batch_graphs.py tests/attention/test_window_saliency.py tests/attention/test_landmark_kernels.py tests/attention/test_tokenselect_graphs.py tests/attention/test_cascade_graphs.py tests/engine/test_decode_ahead.py
