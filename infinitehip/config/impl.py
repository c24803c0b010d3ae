"""One vocabulary for choosing how an op runs, shared by every config and every op.

A config's choice (`InfiniteHiPConfig.impl`, `TokenSelectConfig.impl`, `OffloadConfig.offload_impl`) is one of IMPLS:
- "auto": the Triton kernels on CUDA; elsewhere each op's CPU formulation (below), an op without one its reference;
- "reference": the eager PyTorch oracles, on any device (what the tests compare the kernels with);
- "triton": the Triton kernels (on CPU only under TRITON_INTERPRET=1: triton_interpreter.py).
An op (`impl=` of the dispatch functions: sparse attention, chunk scoring, soft vote, host<->bank row copy, ...)
takes the choice resolved for its device, one of KERNEL_IMPLS: "auto" becomes "triton" or "cpu" (`resolve_impl`).
"cpu" is the op's CPU formulation where it has one, with the same results up to fp32 rounding, tested against the
reference (e.g. representative scores as batched GEMMs; sparse attention as gathered keys and one batched torch
SDPA call), and the reference itself where it has none (`select_impl` dispatches, the Triton module imported on
first use: the CPU path never compiles Triton unless asked).
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

IMPLS = ("auto", "reference", "triton")  # a config's choice
KERNEL_IMPLS = ("triton", "cpu", "reference")  # an op's, "auto" resolved for the device


def check_impl(name: str, value: str) -> None:
    """A config field's validation: ValueError naming the field unless `value` is one of IMPLS."""
    if value not in IMPLS:
        raise ValueError(f"{name} must be one of {IMPLS}, got {value!r}")


def resolve_impl(impl: str, device: torch.device) -> str:
    """A config's choice as an op takes it on `device`: "auto" -> "triton" on CUDA, else "cpu"."""
    if impl == "auto":
        return "triton" if device.type == "cuda" else "cpu"
    return impl


def select_impl(impl: str, reference: Callable, triton_module: str, triton_name: str, what: str,
                cpu: Callable | None = None) -> Callable:
    """`reference` for impl "reference", `cpu` (or `reference`) for "cpu", `triton_module.triton_name` for
    "triton"; anything else is an error."""
    if impl == "reference":
        return reference
    if impl == "cpu":
        return cpu or reference
    if impl == "triton":
        return getattr(importlib.import_module(triton_module), triton_name)
    raise ValueError(f"unknown {what} impl {impl!r}; expected one of {KERNEL_IMPLS}")
