# The kernels' CUDA tests: each Triton op against its eager reference on the GPU (the CPU suite runs them under the
# interpreter, which does not compile them). Minutes; first in a plan list, so a kernel that fails to compile shows
# before the benchmarks that use it; dense's decode replayed from real CUDA graphs against eager (test_auto.py), and
# several sequences' decode in one real CUDA graph against each decoded alone (test_batch_graphs.py).
run kernel_tests timeout 600 python3 -m pytest -q -p no:cacheprovider -x tests/attention/test_dense_paged_decode.py tests/attention/test_sparse_attention.py tests/attention/test_auto.py tests/engine/test_batch_graphs.py
