"""Choosing between an op's eager reference and its Triton kernel (imported on first use: the CPU path never
compiles Triton unless asked)."""

from __future__ import annotations

import importlib
from typing import Callable

KERNEL_IMPLS = ("triton", "reference")


def select_impl(impl: str, reference: Callable, triton_module: str, triton_name: str, what: str) -> Callable:
    """`reference` for impl "reference", `triton_module.triton_name` for "triton"; anything else is an error."""
    if impl == "reference":
        return reference
    if impl == "triton":
        return getattr(importlib.import_module(triton_module), triton_name)
    raise ValueError(f"unknown {what} impl {impl!r}; expected one of {KERNEL_IMPLS}")
