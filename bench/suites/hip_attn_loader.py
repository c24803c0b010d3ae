"""Loading the authors' hip-attn (FSL-1.1; its public v1_2 API only, nothing copied) for the hip-attn suite:
the modules its attention path does not need are stubbed where missing (import_hip), the argument and metadata
names are checked against what hip_attn.py passes (check_signatures), our preset -> its arguments (hip_mapping);
and, for the CPU smoke run, its Triton kernels under the interpreter (smoke_interpreter)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
import types
from unittest import mock

import torch

from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.triton_interpreter import fix_interpreter

NEVER_STUB = ("torch", "triton", "numpy", "hip_attn")  # hip-attn's attention path needs these for real
HIP_MODULES = ("attention_extend", "attention_metadata", "hip_config", "mask_refresh_interval")  # in hip_attn.v1_2


# ---- importing hip-attn ------------------------------------------------------------------------------------------
class _NoOp:
    """Every attribute of a stubbed module: a no-op decorator, decorator factory, context manager or base class."""

    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and callable(a[0]) and not k else self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    __enter__ = lambda self: self  # noqa: E731
    __exit__ = lambda self, *exc: False  # noqa: E731
    __mro_entries__ = lambda self, bases: ()  # noqa: E731


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):  # star-imports and probes see an empty module
            raise AttributeError(name)
        return _NoOp()


def install_stub(name: str) -> None:
    sys.modules[name] = StubModule(name)
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, sys.modules[name])


def triton_jit_shim() -> types.ModuleType:
    """Stand-in for hip_attn.v1_2.triton_jit: its JITFunction subclass asserts triton == 3.4.0 and overrides Triton
    3.4 internals (create_binder's return tuple) that changed since; this maps its decorator onto stock triton.jit
    (+ triton.autotune when given configs), which is what it wraps."""
    import triton

    def triton_jit(walk_dependency=None, do_autotune=None, configs=None, key=None, restore_value=None, **jit_kw):
        def decorate(fn):
            kernel = triton.jit(fn, **jit_kw)  # version, repr, launch_metadata, do_not_specialize*, debug, noinline
            if (configs is not None) if do_autotune is None else do_autotune:
                one = triton.knobs.runtime.interpret  # interpreter: no benchmarker, take its first config
                kernel = triton.autotune(configs=configs[:1] if one else configs, key=key,
                                         restore_value=restore_value)(kernel)
            return kernel
        return decorate

    mod = types.ModuleType("hip_attn.v1_2.triton_jit")
    mod.triton_jit = triton_jit
    return mod


def import_hip(path: str | None) -> tuple[types.SimpleNamespace, dict]:
    """Import the hip_attn.v1_2 modules that define its public attention API (hip_attention = hip_attention_12,
    HiPAttentionArgs, HiPAttentionConfig, HiPMaskRefreshState). The package __init__s are not run: they also load
    the v1.0/v1.1 APIs, HF model wrappers and the sglang glue (flash_attn, sgl_kernel, Triton-driver queries at import).
    Each missing module they import unconditionally is stubbed. Returns (api, info for the JSON)."""
    import triton

    if path:
        pkg_dir = path if os.path.basename(os.path.normpath(path)) == "hip_attn" else os.path.join(path, "hip_attn")
    else:
        spec = importlib.util.find_spec("hip_attn")
        if spec is None:
            raise ModuleNotFoundError("hip_attn is not installed (pip install --no-deps <wheel>, or --hip-path)")
        pkg_dir = list(spec.submodule_search_locations)[0]
    root = os.path.dirname(pkg_dir)
    dist = [d for d in os.listdir(root) if d.startswith("hip_attn-") and d.endswith(".dist-info")]
    info: dict = {"path": pkg_dir, "version": dist[0][len("hip_attn-"):-len(".dist-info")] if dist else None,
                  "imported": list(HIP_MODULES), "stubbed": [], "shims": []}
    shim = None
    if triton.__version__ != "3.4.0":
        shim = triton_jit_shim()
        info["shims"].append(f"hip_attn.v1_2.triton_jit -> stock triton.jit/autotune (it asserts triton 3.4.0, "
                             f"found {triton.__version__})")
    patches = contextlib.ExitStack()
    if not torch.cuda.is_available():  # its autotune configs ask for the device name at import time
        patches.enter_context(mock.patch("torch.cuda.get_device_name", lambda *a, **k: "cpu"))
        info["shims"].append("torch.cuda.get_device_name -> 'cpu' during import (no CUDA)")
    with patches:
        for _ in range(64):
            for name in [m for m in sys.modules if m == "hip_attn" or m.startswith("hip_attn.")]:
                del sys.modules[name]
            for name, where in (("hip_attn", pkg_dir), ("hip_attn.v1_2", os.path.join(pkg_dir, "v1_2"))):
                sys.modules[name] = types.ModuleType(name)  # bare package: its __init__ is not run
                sys.modules[name].__path__ = [where]
            if shim is not None:
                sys.modules[shim.__name__] = shim
            try:
                ext, meta, conf, refresh = (importlib.import_module(f"hip_attn.v1_2.{m}") for m in HIP_MODULES)
                break
            except ModuleNotFoundError as e:
                if not e.name or e.name.split(".")[0] in NEVER_STUB or e.name in info["stubbed"]:
                    raise
                install_stub(e.name)
                info["stubbed"].append(e.name)
    if torch.cuda.is_available():  # its SM count comes from numba.cuda (only use of numba.cuda on this path): seed
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count  # its cache
        for name in ("hip_attn.v1_2.attention_extend", "hip_attn.v1_2.scan_stage"):
            if name in sys.modules:
                sys.modules[name]._NUM_STREAMING_MULTIPROCESSOR = sms
        info["shims"].append(f"SM count cache preset to {sms} from torch (instead of numba.cuda)")
    api = types.SimpleNamespace(attention=ext.dual_stage_quadratic_hip_attention, Args=meta.HiPAttentionArgs,
                                ScanStage=meta.ScanStage, Metadata=meta.HiPAttentionOutputMetadata,
                                Config=conf.HiPAttentionConfig, RefreshState=refresh.HiPMaskRefreshState)
    info["signatures"] = check_signatures(api)
    return api, info


ARG_NAMES = ("sink_token_size", "sliding_window_size", "second_stage_k", "stages", "scan_extend_backend",
             "sa_extend_backend", "using_landmark", "landmark_stage_k", "block_sparse_block_size_q", "using_extend",
             "need_apply_rope", "rope_cos", "rope_sin", "rope_is_neox_style", "model_context_length",
             "extend_context_length", "k_cache", "v_cache", "block_table", "cache_seq_lens", "position_ids",
             "is_decode", "disable_flashdecode", "require_cache_statistics")
STAGE_NAMES = ("stage_block_size_q", "stage_block_stride_q", "stage_chunk_size", "stage_k", "stage_stride")
META_NAMES = ("indices", "ks", "ks_count", "ks_start_end", "mask_cache_statistics", "sa_cache_statistics",
              "stage_caches")


def check_signatures(api) -> dict:
    """Every name this script passes must exist in the installed hip-attn (raises otherwise)."""
    fn = getattr(api.attention, "callback", api.attention)  # its functions are wrapped in a `capture` object
    need = {f"{fn.__module__}.{fn.__name__}": (set(inspect.signature(fn).parameters), {"q", "k", "v", "args", "cached_metadata"}),
            "HiPAttentionArgs": ({f.name for f in dataclasses.fields(api.Args)}, set(ARG_NAMES)),
            "ScanStage": ({f.name for f in dataclasses.fields(api.ScanStage)}, set(STAGE_NAMES)),
            "HiPAttentionOutputMetadata": ({f.name for f in dataclasses.fields(api.Metadata)}, set(META_NAMES)),
            "HiPAttentionConfig": ({f.name for f in dataclasses.fields(api.Config)}, {"mask_refresh_interval"}),
            "HiPMaskRefreshState": (set(inspect.signature(api.RefreshState).parameters) | set(dir(api.RefreshState)),
                                    {"hip_config", "update"})}
    missing = {k: sorted(want - have) for k, (have, want) in need.items() if want - have}
    if missing:
        raise TypeError(f"hip-attn API differs from 1.2.9: missing {missing}")
    return {k: sorted(want) for k, (have, want) in need.items()}


# ---- our preset -> hip-attn arguments ----------------------------------------------------------------------------
def hip_mapping(cfg: InfiniteHiPConfig, layer_type: str, strides: tuple[int, ...]) -> dict:
    """hip-attn v1_2 settings closest to one of our presets (plain data). hip's stage i scores stage_k tokens (the
    previous stage's keep; None = the whole context) in chunks of stage_chunk_size; second_stage_k = final keep."""
    if cfg.attention_rope != "streaming":
        raise ValueError(f"no hip-attn equivalent mapped for attention_rope={cfg.attention_rope!r}")
    late = layer_type == "late"
    keep = cfg.keep_tokens if late else (*cfg.keep_tokens[:-1], cfg.early_last_keep_tokens)
    stages = [dict(stage_block_size_q=b, stage_block_stride_q=s, stage_chunk_size=c,
                   stage_k=None if i == 0 else keep[i - 1], stage_stride=1)
              for i, (b, s, c) in enumerate(zip(cfg.query_block_sizes, strides, cfg.chunk_sizes, strict=True))]
    return dict(sink_token_size=cfg.sink_tokens, sliding_window_size=cfg.stream_tokens, stages=stages,
                second_stage_k=keep[-1], scan_extend_backend="relative" if late else "streaming",
                sa_extend_backend="streaming", using_landmark=cfg.representative == "landmark",
                landmark_stage_k=[1] * len(stages), block_sparse_block_size_q=cfg.query_block_sizes[-1],
                mask_refresh_interval=list(cfg.refresh_intervals))


SMOKE_TWEAKS = ["Triton interpreter: our numpy>=2.4 scalar / bf16-dot fixes (fix_interpreter)",
                "Triton interpreter: a Python bool passed to an unannotated @jit-helper parameter becomes an int1 "
                "tensor (hip's decode scan passes mask_tdst=True and calls .to() on it)",
                "HIP_DISABLE_FLASHDECODE=1: hip's flash-decode stage-2 kernel calls .to() on a range() loop index, "
                "a Python int under the interpreter; its regular block-sparse kernel runs decode instead"]


def smoke_interpreter() -> None:
    """--smoke only (CPU, TRITON_INTERPRET=1): let hip-attn's kernels run under the Triton 3.6 interpreter."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    fix_interpreter()
    os.environ["HIP_DISABLE_FLASHDECODE"] = "1"
    call = interpreter.InterpretedFunction.__call__

    def call_bools_as_tensors(self, *args, **kwargs):
        params = list(inspect.signature(self.fn).parameters.values())
        byname = {p.name: p for p in params}

        def cvt(p, a):
            if isinstance(a, bool) and p is not None and p.annotation is inspect.Parameter.empty:
                return tl.tensor(interpreter.TensorHandle(np.array([a]), tl.int1), tl.int1)
            return a

        args = tuple(cvt(params[i] if i < len(params) else None, a) for i, a in enumerate(args))
        return call(self, *args, **{k: cvt(byname.get(k), v) for k, v in kwargs.items()})

    interpreter.InterpretedFunction.__call__ = call_bools_as_tensors


@contextlib.contextmanager
def _cpu_cuda_calls(cuda: bool):
    """--smoke only: hip-attn calls torch.cuda device / capture queries that fail without CUDA."""
    if cuda:
        yield
        return
    with mock.patch("torch.cuda.current_device", lambda: 0), mock.patch("torch.cuda.set_device", lambda d: None), \
            mock.patch("torch.cuda.is_current_stream_capturing", lambda: False):
        yield
