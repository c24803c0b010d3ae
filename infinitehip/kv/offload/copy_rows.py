"""`copy_rows(src, src_rows, dst, dst_rows, impl)`: dispatch between the eager oracle and the Triton kernel.

See `reference.py` for the semantics; the Triton module is imported on first use.
"""

from __future__ import annotations

import importlib

import torch

from infinitehip.kv.offload.reference import copy_rows_reference

COPY_IMPLS = ("triton", "reference")


def copy_rows(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor, impl: str) -> None:
    if impl == "reference":
        copy_rows_reference(src, src_rows, dst, dst_rows)
    elif impl == "triton":
        importlib.import_module("infinitehip.kv.offload.triton").copy_rows_triton(src, src_rows, dst, dst_rows)
    else:
        raise ValueError(f"unknown copy impl {impl!r}; expected one of {COPY_IMPLS}")
