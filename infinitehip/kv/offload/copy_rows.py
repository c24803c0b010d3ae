"""`copy_rows(src, src_rows, dst, dst_rows, impl)`: dispatch between the eager oracle and the Triton kernel.

See `reference.py` for the semantics; the Triton module is imported on first use. impl: one of config/impl.py's
KERNEL_IMPLS; the copy has no CPU formulation, so "cpu" runs the reference.
"""

from __future__ import annotations

import importlib

import torch

from infinitehip.config.impl import KERNEL_IMPLS
from infinitehip.kv.offload.reference import copy_rows_reference


def check_copy_impl(impl: str) -> None:
    if impl not in KERNEL_IMPLS:
        raise ValueError(f"unknown copy impl {impl!r}; expected one of {KERNEL_IMPLS}")


def copy_rows(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor, impl: str) -> None:
    check_copy_impl(impl)
    if impl == "triton":
        importlib.import_module("infinitehip.kv.offload.triton").copy_rows_triton(src, src_rows, dst, dst_rows)
    else:  # "reference", "cpu"
        copy_rows_reference(src, src_rows, dst, dst_rows)
