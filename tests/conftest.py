"""Shared set-up and fixtures: the Triton interpreter on CPU, tiny random Hugging Face models of each supported
family (saved as safetensors), engines built from them. For the suite's time: the interpreter patches a kernel's
helpers once per launch, each real GGUF is parsed and the embedded model loaded once per pytest process, and the
slowest modules are collected first (`make test` hands them to its workers in that order)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

# Without a CUDA device Triton kernels run under the interpreter. Set before anything imports triton (conftest is
# imported before every test module, in each xdist worker too), so the test modules need no preamble of their own.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _skip_repeated_interpreter_patching() -> None:
    """Triton 3.6's interpreter re-patches `triton.language` (inspect.getmembers over tl, tl.core, tl.math,
    tl.tensor: ~7 ms) every time a kernel calls a @triton.jit helper, i.e. once per helper call per program. That
    patch is never undone (only the launch's own patches are, when the launch ends), so within a launch every
    repeat re-installs equivalent wrappers. Here a helper is patched the first time it is called within a launch
    only; launches patch and restore as before, so every kernel computes exactly what it did (measured: -30% CPU
    time on the LRU tests, whose one-row copy programs each call a helper)."""
    import threading

    import triton
    from triton.runtime import interpreter

    call = interpreter.InterpretedFunction.__call__
    # call_helper repeats 3.6's InterpretedFunction.__call__ but for the patch: other versions keep their own
    if not triton.__version__.startswith("3.6.") or getattr(call, "_infinitehip_once_per_launch", False):
        return
    launch_state = threading.local()  # .patched within a launch: the helpers patched so far (None outside)
    launch = interpreter.GridExecutor.__call__

    def launch_once(self, *args, **kwargs):
        outer, launch_state.patched = getattr(launch_state, "patched", None), set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            launch_state.patched = outer

    def call_helper(self, *args, **kwargs):  # InterpretedFunction.__call__ with the repeat patch skipped
        patched = getattr(launch_state, "patched", None)
        if patched is None or self.fn not in patched:
            interpreter._patch_lang(self.fn)
            if patched is not None:
                patched.add(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    call_helper._infinitehip_once_per_launch = True
    interpreter.GridExecutor.__call__ = launch_once
    interpreter.InterpretedFunction.__call__ = call_helper


if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        _skip_repeated_interpreter_patching()
    except (ImportError, AttributeError):  # no triton, or an interpreter of another shape: left as it is
        pass


def _share_gguf_readers(min_bytes: int = 16 << 20) -> None:
    """One `gguf.GGUFReader` per real model file and pytest process, shared by every later open of the same file.

    Parsing a GGUF's metadata builds Python objects for each entry of its token arrays: ~4 s of CPU for the
    embedded model (49K tokens and merges), ~17 s for Gemma 3 270M (262K), and the embedded model was opened by the
    tokenizer fixture, read_gguf / convert_gguf, transformers' GGUF loader and GGUF tokenizer, five times in
    test_gguf_convert.py alone. A reader is a read-only memory map plus the parsed fields; every consumer only
    reads it. Files are keyed by (real path, size, mtime), so a rewritten file is parsed again; small files (the
    tests' tiny GGUFs, written per test) are never shared."""
    import gguf

    base = gguf.GGUFReader
    if getattr(base, "_infinitehip_shared", False):
        return
    shared: dict[tuple, object] = {}

    def key(path, mode):
        try:
            st = os.stat(path)
        except (OSError, TypeError, ValueError):
            return None
        return (os.path.realpath(path), st.st_size, st.st_mtime_ns) if mode == "r" and st.st_size >= min_bytes else None

    class SharedGGUFReader(base):
        _infinitehip_shared = True

        def __new__(cls, path, mode="r"):
            k = key(path, mode)
            return shared[k] if k in shared else super().__new__(cls)

        def __init__(self, path, mode="r"):
            if getattr(self, "_shared_ready", False):  # (a shared reader: parsed once)
                return
            super().__init__(path, mode)
            self._shared_ready = True
            k = key(path, mode)
            if k is not None:
                shared[k] = self

    gguf.GGUFReader = SharedGGUFReader


try:
    _share_gguf_readers()
except ImportError:  # no gguf: nothing to share
    pass

# `make test` runs one xdist worker per core: one intra-op thread each, or the workers' torch pools oversubscribe
# the cores (measured on the 2-core machine: no faster than one process).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

import transformers  # noqa: E402

from infinitehip.config.engine import EngineConfig  # noqa: E402
from infinitehip.config.model import ModelConfig  # noqa: E402
from infinitehip.engine.llm_engine import LLMEngine  # noqa: E402
from infinitehip.model.loading import LoadedModel, empty_model, load_weights_from_dir  # noqa: E402


def _share_the_embedded_model() -> None:
    """The embedded model, loaded once per pytest process: `load_model(None, ...)` (the default model, as the
    engines of EngineConfig() and the test modules' fixtures load it) returns the same LoadedModel for the same
    cache root, device and dtype. About 20 test modules load it (~1 s each after the first, plus its tokenizer),
    and in `make test` each worker runs about half of them. Nothing changes a loaded model: the engines only read
    its weights (inference mode) and the tokenizer. Any other model (a path, a built-in name, a Hub id) loads as
    before, so the loading tests see no difference."""
    from pathlib import Path

    from infinitehip.engine import llm_engine
    from infinitehip.model import loading

    load = loading.load_model
    if getattr(load, "_infinitehip_shared", False):
        return
    shared: dict[tuple, LoadedModel] = {}

    def load_model(model, cache_root, device, dtype):
        if model is not None:
            return load(model, cache_root, device, dtype)
        key = (str(Path(cache_root).resolve()), str(torch.device(device)), dtype)
        if key not in shared:
            shared[key] = load(model, cache_root, device, dtype)
        return shared[key]

    load_model._infinitehip_shared = True
    loading.load_model = llm_engine.load_model = load_model


_share_the_embedded_model()

_COMMON = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
)

TINY_CONFIGS = {
    "llama3": lambda: transformers.LlamaConfig(
        **_COMMON, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=256),
    ),
    "qwen2": lambda: transformers.Qwen2Config(**_COMMON, rope_theta=1e6, tie_word_embeddings=True),
    "qwen3": lambda: transformers.Qwen3Config(**_COMMON, head_dim=32, rope_theta=1e6, tie_word_embeddings=True),
    "mistral": lambda: transformers.MistralConfig(**_COMMON, sliding_window=None, rope_theta=1e6),
    # Hybrid layers (sliding, sliding, full, x2) with a 16-token window: the tests' prompts wrap its ring often.
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **{**_COMMON, "num_hidden_layers": 6, "num_key_value_heads": 1}, head_dim=32, sliding_window=16,
        query_pre_attn_scalar=24, layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2),
}


# The modules that take longest, longest first (each file's seconds in the junit report of a `make test` run on
# the 2-core machine). `make test` hands whole modules to its workers in collection order (--dist loadfile
# --no-loadscope-reorder); xdist's default order (most tests first) started heavy modules with few tests last
# (lm-eval: 1 test, ~25 s) and a worker could still be running one while the other had nothing left.
# Longest first, the modules that start last are short ones and both workers finish together. Modules not
# listed (each under ~5 s) follow in their usual order.
SLOWEST_FIRST = (
    "test_server.py", "test_prefix_cache.py", "test_kv_offload.py", "test_bench.py", "test_embedded_model.py",
    "test_gemma3_model.py", "test_ruler_genres.py", "test_ruler.py", "test_infinitehip_decode.py",
    "test_infinipot.py", "test_lm_eval_client.py", "test_gguf_gemma3.py", "test_serve_process.py",
    "test_question_selection.py", "test_tokenselect.py", "test_offload_engine.py", "test_dense_paged_decode.py",
    "test_tensor_parallel.py", "test_offload_saliency_window.py", "test_readme_patch_example.py", "test_baselines.py",
    "test_gguf_convert.py", "test_landmark_kernels.py", "test_kv_offload_validation.py", "test_offload_mask_rows.py",
    "test_offload_decode_rows.py", "test_pruning_scoring.py", "test_server_faults.py", "test_eval_tasks.py",
    "test_cli_generate.py", "test_transformers_patch.py",
)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering (grouping by fixture parameters), kept within a module
def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module's tests keep their order


@pytest.fixture(scope="session", params=sorted(TINY_CONFIGS))
def tiny_hf_model(request, tmp_path_factory):
    """(family name, HF model in fp32 eval mode, saved directory)."""
    torch.manual_seed(0)
    config = TINY_CONFIGS[request.param]()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # non-trivial biases / norms so a wrong mapping shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded model's tokenizer (its ids cover the tiny models' 512-token vocabulary), as its conversion cache
    saved it: transformers' tokenizer of the GGUF, written by convert_gguf after checking it against the GGUF's
    metadata (test_gguf_convert.py compares the two). Built from the GGUF again it took ~8 s of CPU per worker, from
    the cache 0.3 s."""
    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import resolve_model_dir

    model_dir, _ = resolve_model_dir(None, default_cache_root())  # (converted on first use, as every engine does)
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama-3 model (TINY_CONFIGS["llama3"], seed 0), saved once per session: the model of the
    baselines' tests and of the method matrix (test_method_matrix.py)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(TINY_CONFIGS["llama3"]())
    path = tmp_path_factory.mktemp("tiny_llama3")
    model.save_pretrained(path)
    return path


def random_ids(n: int, seed: int = 0) -> list[int]:
    """n token ids drawn from the tiny models' 512-token vocabulary."""
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def generate_greedy(engine, ids, max_tokens, trace=None):
    """Greedy completion; `trace` (a list) receives (is_prefill, cache slots in use) after every step."""
    from infinitehip import SamplingParams

    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    while engine.has_work:
        in_prefill = seq.in_prefill
        engine.step()
        if trace is not None:
            trace.append((in_prefill, seq.num_cached))
    return seq


def engine_for_dir(path, tokenizer=None, method_config=None, offload=None, device: str = "cpu", **config) -> LLMEngine:
    model_config = ModelConfig.from_dir(path)
    model = empty_model(model_config, torch.device(device), torch.float32)
    load_weights_from_dir(model, path)
    cfg = EngineConfig(device=device, dtype="float32", show_progress=False, method_config=method_config, offload=offload,
                       **config)
    return LLMEngine(cfg, LoadedModel(model_config, model, tokenizer, "test", path))


def closure_graph_decoder(engine, min_bucket: int = 512, ahead: bool = False):
    """Give the engine a graph decoder with CUDA-graph semantics on CPU (`engine/graph_decode.ClosureRecorder`:
    a replay re-runs the captured closure with the host values of the capture). ahead: steps launched ahead
    (engine/decode_ahead.py) as on CUDA; off by default, so each engine step runs one step through `runner.run`
    (what the step hooks below observe)."""
    from infinitehip.engine.graph_decode import ClosureRecorder, GraphDecoder

    r = engine.runner
    r.graph_decoder = GraphDecoder(r.model, r.cache, r.rope, r.method, engine.max_context_tokens, min_bucket=min_bucket,
                                   recorder=ClosureRecorder, attention=r.router, max_num_seqs=engine.config.max_num_seqs)
    engine.ahead.enabled = ahead and engine.config.overlap_decode
    return r.graph_decoder


def engine_with_graphs(path, config, method: str, graphs: bool, device: str = "cpu", min_bucket: int = 256, **room):
    """-> (engine, its graph decoder or None): real CUDA graphs on cuda, the closure stand-in on the CPU."""
    engine = engine_for_dir(path, None, config, method=method, device=device, **room,
                            cuda_graphs=graphs and device == "cuda")
    decoder = closure_graph_decoder(engine, min_bucket=min_bucket) if graphs and device == "cpu" else \
        engine.runner.graph_decoder
    return engine, decoder


def decode_graph_keys(engine) -> list:
    """The method's graph key of each decode step's first sequence from now on (read at layer 0), checking at each
    that a needle probe makes the step eager (key None)."""
    keys, decode = [], engine.method.decode

    def keyed(layer, q, seqs, batch):
        if layer == 0:
            keys.append(engine.method.graph_key(seqs[0]))
            assert engine.method.graph_key(dataclasses.replace(seqs[0], probe=object())) is None
        return decode(layer, q, seqs, batch)

    engine.method.decode = keyed
    return keys


def after_each_decode_step(engine, on_step) -> None:
    """Call on_step(engine, decode step) after every engine step once the running sequence has method state."""
    inner = engine.step

    def step():
        out = inner()
        running = engine.scheduler.running
        if running and running[0].method_state is not None:
            on_step(engine, running[0].method_state.decode_steps[0])
        return out

    engine.step = step


def record_step_logits(engine) -> list:
    """A list that receives (a copy of) the logits of every step the engine runs from now on."""
    logits, inner = [], engine.runner.run

    def recording(plan):
        samplers, out = inner(plan)
        logits.append(out.clone())
        return samplers, out

    engine.runner.run = recording
    return logits


def run_staggered(engine, requests) -> list:
    """requests: (prompt ids, tokens to decode, engine step at which it arrives), greedy -> each one's sequence, once
    the engine has run them all (a batch whose members join at different steps)."""
    from infinitehip import SamplingParams

    seqs, step = {}, 0
    while engine.has_work or len(seqs) < len(requests):
        for i, (prompt, n, at) in enumerate(requests):
            if at == step:
                seqs[i] = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        engine.step()
        step += 1
    return [seqs[i] for i in range(len(requests))]
