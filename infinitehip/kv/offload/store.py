"""The KV store of an offloaded cache: every token's K and V of every layer, as flat slots [slots, Hkv, d] per layer.

Slot numbering is `PagedKVCache`'s (slot = page * page_size + offset), so a sequence's page table maps
its tokens to store slots unchanged. A layer's store lives in host memory, pinned when CUDA is available:
pinned host memory is addressable from GPU kernels (UVA), which is how the Triton row copy reads and writes
it without a host sync. When the host budget cannot hold every layer (a 2M-token FP8 store of an 8B model is
128 GiB), the planner spills whole layers to GPU memory (`device_layers`, the last ones): the banks and the
kernels treat them like the others (a miss of such a layer is a device-to-device row copy). FP8 storage
(e4m3 / e5m2) saturates values to the format's finite range when writing (a plain cast would turn
out-of-range values into NaN / inf); readers upcast.
"""

from __future__ import annotations

import importlib
import weakref

import torch

from infinitehip.kv.offload.copy_rows import copy_rows

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def to_storage_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in the storage dtype; FP8 saturates to the largest finite value instead of overflowing."""
    if x.dtype == dtype:
        return x
    if dtype in FP8_DTYPES:
        limit = torch.finfo(dtype).max
        return x.float().clamp(-limit, limit).to(dtype)
    return x.to(dtype)


def dtype_label(dtype: torch.dtype) -> str:
    """Short name for summaries: FP8 (e4m3/e5m2), BF16, FP16, FP32."""
    labels = {torch.float8_e4m3fn: "FP8 e4m3", torch.float8_e5m2: "FP8 e5m2", torch.bfloat16: "BF16",
              torch.float16: "FP16", torch.float32: "FP32"}
    if dtype not in labels:
        raise ValueError(f"unsupported KV storage dtype {dtype}")
    return labels[dtype]


def page_locked_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised host tensor, page-locked at its exact size.

    `torch.empty(pin_memory=True)` goes through the caching host allocator, which rounds every block up to a
    power of two: a 32.1 GiB store would lock 64 GiB and fail where the planner promised it fits. Registering
    ordinary memory with cudaHostRegister locks exactly what is used; the caller unregisters it."""
    tensor = torch.empty(shape, dtype=dtype)
    cudart = torch.cuda.cudart()
    flags = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped: every device may address it (UVA)
    status = cudart.cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(), flags)
    if int(status) != 0:
        gib = tensor.numel() * tensor.element_size() / 2**30
        raise MemoryError(f"could not page-lock {gib:.1f} GiB of host memory for the KV store (cudaHostRegister: "
                          f"{status}); lower max_context_tokens or host_memory_fraction")
    return tensor


def _gather(src: torch.Tensor, slots: torch.Tensor, out: torch.Tensor, impl: str) -> torch.Tensor:
    """Rows `slots` [N] of src into out [N, ...] (copy_rows: upcast, UVA reads with impl "triton") -> out."""
    copy_rows(src, slots.reshape(-1).to(out.device), out, torch.arange(slots.numel(), device=out.device), impl)
    return out


def _unregister(pointers: list[int]) -> None:
    cudart = torch.cuda.cudart()
    for pointer in pointers:
        cudart.cudaHostUnregister(pointer)


class KVStore:
    """k[layer] / v[layer]: [num_slots, Hkv, d] in `dtype`; layers >= num_layers - device_layers on `device`."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        pin_memory: bool | None = None,
        device_layers: int = 0,
        device: torch.device | str = "cpu",
    ):
        for name, value in (("num_layers", num_layers), ("num_slots", num_slots), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0 <= device_layers <= num_layers:
            raise ValueError(f"device_layers must be in [0, num_layers={num_layers}], got {device_layers}")
        dtype_label(dtype)  # validates the dtype
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        self.num_layers, self.num_slots, self.device_layers = num_layers, num_slots, device_layers
        self.dtype = dtype
        host_layers = num_layers - device_layers
        host_shape, row = (host_layers, num_slots, num_kv_heads, head_dim), (num_slots, num_kv_heads, head_dim)
        # Uninitialised like PagedKVCache: a slot is written before any bank reads it.
        if pin_memory and host_layers:
            host_k, host_v = page_locked_empty(host_shape, dtype), page_locked_empty(host_shape, dtype)
            # Unlocked when the store goes away (the cache owns the store for its whole life).
            weakref.finalize(self, _unregister, [host_k.data_ptr(), host_v.data_ptr()])
        else:
            host_k, host_v = torch.empty(host_shape, dtype=dtype), torch.empty(host_shape, dtype=dtype)
        self._pinned = pin_memory and host_layers > 0
        spilled = [(torch.empty(row, dtype=dtype, device=device), torch.empty(row, dtype=dtype, device=device))
                   for _ in range(device_layers)]
        self.k = [*host_k.unbind(0), *(k for k, _ in spilled)]
        self.v = [*host_v.unbind(0), *(v for _, v in spilled)]

    @property
    def is_pinned(self) -> bool:
        """Whether the host-memory layers are page-locked (UVA-addressable)."""
        return self._pinned

    @property
    def row_shape(self) -> tuple[int, int]:
        return tuple(self.k[0].shape[-2:])

    @property
    def bytes_per_token(self) -> int:
        """Store bytes of one token: K and V of every layer (host and spilled layers together)."""
        return 2 * self.num_layers * self.k[0][0].numel() * self.k[0].element_size()

    @property
    def device_bytes(self) -> int:
        """GPU memory of the spilled layers."""
        return self.device_layers * self.num_slots * self.bytes_per_token // self.num_layers

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str = "reference") -> None:
        """k/v [T, Hkv, d] (any device, any float dtype) into slots [T] of `layer`.

        impl "triton" converts and scatters device rows straight into the pinned store, one launch per tensor (no
        host sync); "reference" converts and copies through torch (syncs when k is on the GPU)."""
        dst = slots.reshape(-1).to(k.device)
        if impl == "triton" and k.is_floating_point() and k.dtype not in FP8_DTYPES:
            kernels = importlib.import_module("infinitehip.kv.offload.triton")
            kernels.write_rows_triton(k, self.k[layer], dst)
            kernels.write_rows_triton(v, self.v[layer], dst)
            return
        rows = torch.arange(slots.numel(), device=k.device)
        copy_rows(to_storage_dtype(k, self.dtype), rows, self.k[layer], dst, impl)
        copy_rows(to_storage_dtype(v, self.dtype), rows, self.v[layer], dst, impl)

    def gather_k(self, layer: int, slots: torch.Tensor, out: torch.Tensor, impl: str = "reference") -> torch.Tensor:
        """Keys of slots [N] into out [N, Hkv, d] (any device, a float dtype: FP8 is upcast while copying) -> out.
        impl "triton" reads the pinned store from the GPU without a host sync, as `write` does."""
        return _gather(self.k[layer], slots, out, impl)

    def gather_v(self, layer: int, slots: torch.Tensor, out: torch.Tensor, impl: str = "reference") -> torch.Tensor:
        """Values of slots [N] into out [N, Hkv, d], as `gather_k`."""
        return _gather(self.v[layer], slots, out, impl)

    def read(self, layer: int, slots: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [N, Hkv, d] of slots [N] (returned on the host), upcast to `dtype` if given."""
        idx = slots.reshape(-1).to(self.k[layer].device)
        k, v = self.k[layer].index_select(0, idx).cpu(), self.v[layer].index_select(0, idx).cpu()
        if dtype is not None:
            k, v = k.to(dtype), v.to(dtype)
        return k, v
