"""Choosing between an op's eager reference, its CPU formulation and its Triton kernel (imported on first use:
the CPU path never compiles Triton unless asked). The names: config/impl.py's KERNEL_IMPLS."""

from __future__ import annotations

import importlib
from typing import Callable

from infinitehip.config.impl import KERNEL_IMPLS


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
