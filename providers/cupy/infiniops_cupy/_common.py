"""What the CuPy provider's implementations share: constraints, priority, and the DLPack/stream bridge."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final

import torch

from infiniops_py import Constraint, CudaAvailable, OneOf, Requires

if TYPE_CHECKING:
    import cupy

__all__ = ["DTYPES", "PRIORITY", "SCALAR_TYPES", "as_cupy", "base_constraints", "module", "stream"]

PRIORITY: Final = 15
DTYPES: Final = OneOf("dtype", ("float16", "bfloat16", "float32"))

#: The CUDA C type of each torch dtype, as the kernels' SCALAR macro.
SCALAR_TYPES: Final = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16", torch.float32: "float"}

_HEADER: Final = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
// Round through the storage type: the value a tensor of that dtype would hold.
__device__ __forceinline__ float rnd(float v) { return to_f(from_f<SCALAR>(v)); }
__device__ __forceinline__ float block_sum(float v, float* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (blockDim.x + 31) / 32) ? shared[threadIdx.x] : 0.0f;
    if (warp == 0) for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}
"""


def base_constraints() -> tuple[Constraint, ...]:
    """Device, import and GPU constraints every CuPy implementation starts with."""
    return (
        OneOf("device_type", ("cuda",), fix="move the tensors to a CUDA device, or use the torch provider"),
        Requires("cupy", "'infiniops-provider-cupy[cuda13]' (or [cuda12] for CUDA 12)"),
        CudaAvailable(always=True),
    )


def _cupy() -> Any:
    import cupy

    return cupy


def stream(device: torch.device) -> cupy.cuda.ExternalStream:
    """torch's current CUDA stream on `device`, as a CuPy stream (kernels must run on it)."""
    return _cupy().cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream, device.index or 0)


def as_cupy(t: torch.Tensor | None) -> cupy.ndarray | None:
    """A zero-copy CuPy view of `t` through DLPack (bfloat16, which CuPy lacks, travels as int16 bits)."""
    if t is None:
        return None
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return _cupy().from_dlpack(t)


@functools.cache
def module(source: str, scalar: str) -> cupy.RawModule:
    """Compile (once per source and scalar type) a RawModule with ``SCALAR`` defined and the shared header."""
    code = f"#define SCALAR {scalar}\n{_HEADER}\n{source}"
    return _cupy().RawModule(code=code, options=("-std=c++17",))
