"""Gemm through CuPy's cuBLAS binding (cublasGemmStridedBatchedEx, fp32 compute).

In fp32 without `c` or `bias`, cuBLAS writes `out` directly. Otherwise cuBLAS writes ``alpha * op(a) @ op(b)``
to an fp32 workspace and one small kernel adds ``beta * c + bias`` and rounds once to the output dtype
(rounding ``beta * c`` to fp16/bf16 first loses digits that large `beta` makes visible). `c` is never read
when the contract dropped it (beta == 0); `out` may be `c` (each element is read before it is written).
Row-major tensors are handed to column-major cuBLAS as the transposed
product ``out^T = op(b)^T @ op(a)^T``.
"""

from __future__ import annotations

import numpy as np
import torch

from infiniops_cupy._common import DTYPES, PRIORITY, SCALAR_TYPES, as_cupy, base_constraints, module, stream
from infiniops_py import Capability, Implementation

__all__ = ["IMPLEMENTATIONS", "gemm"]

_EPILOGUE = r"""
extern "C" __global__ void epilogue(SCALAR* __restrict__ out, const float* __restrict__ acc,
                                    const SCALAR* __restrict__ c, long long c_b, long long c_m, long long c_n,
                                    float beta, const SCALAR* __restrict__ bias,
                                    long long total, long long m_size, long long cols) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;   // over batch * M * N
    if (i >= total) return;
    const long long bt = i / (m_size * cols), m = (i / cols) % m_size, n = i % cols;
    float v = acc[i] + (bias ? to_f(bias[n]) : 0.0f);
    if (c) v += beta * to_f(c[bt * c_b + m * c_m + n * c_n]);   // c: a view expanded to out's shape
    out[i] = from_f<SCALAR>(v);                                  // one rounding, at the very end
}
"""

_CUDA_TYPES = {torch.float16: 2, torch.float32: 0, torch.bfloat16: 14}  # cudaDataType: R_16F, R_32F, R_16BF
_COMPUTE_32F = 68  # CUBLAS_COMPUTE_32F: fp32 accumulation, no TF32 shortcut
_GEMM_DEFAULT = -1


def _cublas_gemm(a: torch.Tensor, b: torch.Tensor, alpha: float, trans_a: bool, trans_b: bool,
                 target: torch.Tensor, m: int, n: int, k: int, batch: int) -> None:
    """``target = alpha * op(a) @ op(b)`` (target fp32 or a's dtype), as ``target^T = op(b)^T op(a)^T``."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    alpha_h = np.array([alpha], dtype=np.float32)
    beta_h = np.array([0.0], dtype=np.float32)
    handle = cupy.cuda.device.get_cublas_handle()
    op_b = cublas.CUBLAS_OP_T if trans_b else cublas.CUBLAS_OP_N
    op_a = cublas.CUBLAS_OP_T if trans_a else cublas.CUBLAS_OP_N
    ldb = k if trans_b else n
    lda = m if trans_a else k
    stride_a = a.stride(0) if a.dim() == 3 else 0
    stride_b = b.stride(0) if b.dim() == 3 else 0
    a_cp, b_cp, t_cp = as_cupy(a), as_cupy(b), as_cupy(target)
    cublas.gemmStridedBatchedEx(
        handle, op_b, op_a, n, m, k, alpha_h.ctypes.data, b_cp.data.ptr, _CUDA_TYPES[b.dtype], ldb, stride_b,
        a_cp.data.ptr, _CUDA_TYPES[a.dtype], lda, stride_a, beta_h.ctypes.data, t_cp.data.ptr,
        _CUDA_TYPES[target.dtype], n, m * n, batch, _COMPUTE_32F, _GEMM_DEFAULT)


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, bias: torch.Tensor | None, alpha: float,
         beta: float, trans_a: bool, trans_b: bool, out: torch.Tensor) -> torch.Tensor:
    m, n = out.shape[-2], out.shape[-1]
    k = a.shape[-2] if trans_a else a.shape[-1]
    batch = out.shape[0] if out.dim() == 3 else 1
    if out.numel() == 0:
        return out
    a, b = a.contiguous(), b.contiguous()
    # fp16/bf16 always accumulate into the fp32 workspace: cuBLAS' default may reduce split-K partial sums
    # in the output dtype, which the H200 run showed 4 ulps off at K=511 (bf16).
    epilogue = c is not None or bias is not None or out.dtype != torch.float32
    target = torch.empty(out.shape, dtype=torch.float32, device=out.device) if epilogue else out
    with stream(out.device):
        if k == 0:
            target.zero_()
        else:
            _cublas_gemm(a, b, alpha, trans_a, trans_b, target, m, n, k, batch)
        if epilogue:
            cs = (0, 0, 0) if c is None else ((0, *c.stride()) if c.dim() == 2 else c.stride())
            total = out.numel()
            fn = module(_EPILOGUE, SCALAR_TYPES[out.dtype]).get_function("epilogue")
            fn(((total + 255) // 256,), (256,), (
                as_cupy(out), as_cupy(target), as_cupy(c), np.int64(cs[0]), np.int64(cs[1]), np.int64(cs[2]),
                np.float32(beta), as_cupy(bias), np.int64(total), np.int64(m), np.int64(n)))
    return out


IMPLEMENTATIONS = [
    Implementation("gemm", "cupy", "cupy.gemm_cublas", Capability(*base_constraints(), DTYPES), PRIORITY, gemm),
]
