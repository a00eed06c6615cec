"""The Triton dense, conv, attention and SSD kernels compile for the H200 (sm_90) without a GPU, the way they
will run.

CI has no GPU, and the interpreter runs kernels as numpy, so neither says whether a kernel compiles for
Hopper nor whether it reads memory the fast way. Triton compiles ahead of time here (its bundled ptxas,
no driver), with the specializations the launchers produce at the benchmark's sizes (16-byte aligned
pointers, unit strides as constants), and the PTX is checked for what the bandwidth targets rest on:
16-byte vector loads, no register spills, tensor-core (wgmma) pipelines in the Gemm and the attention
prefill (TMA loads exactly in the configurations that ask for them), register-only taps in the
channel-first causal_conv1d, float64 scores of float32 attention on the FP64 tensor cores within the shared
memory of the configuration float32 takes. The SSD kernels' check also counts the
register spills ptxas reports.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
from infiniops_triton import (
    _gemv,
    add,
    causal_conv1d,
    fused_qk_norm,
    fused_qk_norm_rope,
    gemm,
    paged_cache,
    rms_norm,
    rms_norm_gated,
    rotary_embedding,
    sampling,
    silu_and_mul,
)
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend, get_ptxas
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)
BF16 = "*bf16"
SMEM_LIMIT = 227 * 1024


class _Ptr(str):
    """A pointer argument (its Triton type), 16-byte aligned like a fresh torch allocation."""


def _compile(kernel: Any, args: dict[str, Any], num_warps: int, num_stages: int = 3,
             maxnreg: int | None = None) -> Any:
    """Compile `kernel` for sm_90 with the runtime's specialization of `args` (ints equal to 1 become
    constants, ints and pointers divisible by 16 are marked so, except the kernel's `do_not_specialize`)."""
    while not isinstance(kernel, triton.runtime.jit.JITFunction):  # autotuner / heuristics wrappers
        kernel = kernel.fn
    backend = CUDABackend(TARGET)
    signature, constants, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(kernel.arg_names, kernel.params)):
        value = args[name]
        fixed = param.do_not_specialize
        if param.is_constexpr or (type(value) is int and value == 1 and not fixed):
            signature[name], constants[(i,)] = "constexpr", value
        elif isinstance(value, _Ptr):
            signature[name], attrs[(i,)] = str(value), backend.parse_attr("D")
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32" if abs(value) < 2**31 else "i64"
            if value % 16 == 0 and not fixed:
                attrs[(i,)] = backend.parse_attr("D")
    source = ASTSource(kernel, signature, constants, attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages,
                                                          "maxnreg": maxnreg})


def _ptxas_report(compiled: Any, pattern: str) -> int:
    """The number `pattern` captures in what ``ptxas -v`` reports for the kernel (its registers and spills are
    decided after the PTX)."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(compiled.asm["ptx"])
        f.flush()
        info = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                              capture_output=True, text=True, check=True)
    found = re.search(pattern, info.stdout + info.stderr)
    assert found is not None, info.stdout + info.stderr
    return int(found.group(1))


def _ptxas_spills(compiled: Any) -> int:
    """Bytes of register spill stores ptxas reports for the kernel."""
    return _ptxas_report(compiled, r"(\d+) bytes spill stores")


def _count(compiled: Any, pattern: str) -> int:
    return len(re.findall(pattern, compiled.asm["ptx"]))


def _fast_memory(compiled: Any) -> None:
    assert _count(compiled, r"ld\.global[.\w:]*\.v4") > 0, "no 16-byte vector loads"
    assert _count(compiled, r"st\.global[.\w:]*\.v4") > 0, "no 16-byte vector stores"
    assert _count(compiled, r"(ld|st)\.local") == 0, "registers spill to local memory"


def _row_kernels() -> list[tuple[str, Any, dict[str, Any], int]]:
    t, h = 32768, 4096
    norm = {"T": t, "H": h, "eps": 1e-6, "ROWS": 1, "BLOCK": h, "PDL": False}
    cache = {f"stride_{n}": s for n, s in (("kt", 1024), ("kh", 128), ("kd", 1), ("vt", 1024), ("vh", 128),
                                          ("vd", 1), ("kcb", 16384), ("kcs", 1024), ("kch", 128), ("kcd", 1),
                                          ("vcb", 16384), ("vcs", 1024), ("vch", 128), ("vcd", 1))}
    flat = {"size1": 1, "size2": 1, "size3": 1, **{f"s{x}{i}": 0 for x in "abo" for i in range(3)},
            "sa3": 1, "sb3": 1, "so3": 1}
    return [
        ("rms_norm", rms_norm._rms_norm_kernel,
         {"X": _Ptr(BF16), "W": _Ptr(BF16), "Y": _Ptr(BF16), "stride_x": h, "stride_y": h, **norm}, 8),
        ("rms_norm_gated", rms_norm_gated._rms_norm_gated_kernel,  # Mamba-2-130m's: z a slice of in_proj's rows
         {"X": _Ptr(BF16), "Z": _Ptr(BF16), "W": _Ptr(BF16), "B": _Ptr(BF16), "Y": _Ptr(BF16), "GROUP": 1536,
          "stride_x": 1536, "stride_z": 3352, "stride_y": 1536, "eps": 1e-5, "BLOCK": 2048, "HAS_Z": True,
          "HAS_BIAS": False, "NORM_BEFORE_GATE": False, "PDL": False}, 8),
        ("fused_add_rms_norm", rms_norm._fused_add_rms_norm_kernel,
         {"X": _Ptr(BF16), "R": _Ptr(BF16), "W": _Ptr(BF16), "stride_x": h, "stride_r": h, **norm}, 8),
        ("add", add._add_kernel, {"A": _Ptr(BF16), "B": _Ptr(BF16), "OUT": _Ptr(BF16), "numel": t * h,
                                  "alpha": 1.0, **flat, "NDIM": 1, "WIDE": False, "BLOCK": 4096}, 8),
        *[(f"add_flat_{c.kwargs['BLOCK']}_{c.num_warps}w{'_evict' if c.kwargs['EVICT'] else ''}",
           add._add_flat_kernel, {"A": _Ptr(BF16), "B": _Ptr(BF16), "OUT": _Ptr(BF16), "numel": t * h,
                                  "alpha": 1.0, "size_class": 28, "WIDE": False, "EVEN": True, **c.kwargs},
           c.num_warps) for c in add._FLAT_CANDIDATES],
        ("fused_qk_norm", fused_qk_norm._qk_norm_kernel,
         {"QKV": _Ptr(BF16), "QW": _Ptr(BF16), "KW": _Ptr(BF16), "stride_t": 6144, "num_q_heads": 32,
          "num_qk_heads": 40, "D": 128, "eps": 1e-6, "BLOCK_H": 16, "BLOCK_D": 128}, 8),
        ("reshape_and_cache_flash", paged_cache._reshape_and_cache_kernel,
         {"K": _Ptr(BF16), "V": _Ptr(BF16), "KC": _Ptr(BF16), "VC": _Ptr(BF16), "SLOTS": _Ptr("*i64"),
          "stride_s": 1, "num_slots": 65536, "block_size": 16, "num_heads": 8, "D": 128, **cache,
          "BLOCK_H": 8, "BLOCK_D": 128}, 4),
        ("silu_and_mul", silu_and_mul._silu_and_mul_kernel,
         {"X": _Ptr(BF16), "OUT": _Ptr(BF16), "D": 3072, "stride_x": 6144, "stride_o": 3072, "BLOCK": 1024,
          "PDL": False}, 4),
        *[(f"rotary_embedding_{style}", rotary_embedding._rotary_kernel,
           {"POS": _Ptr("*i64"), "Q": _Ptr(BF16), "K": _Ptr(BF16), "CACHE": _Ptr(BF16), "stride_p": 1,
            "stride_qt": 4096, "stride_qh": 128, "stride_kt": 4096, "stride_kh": 128, "num_q_heads": 16,
            "num_heads": 24, "max_position": 40960, "HALF": 64, "IS_NEOX": style == "neox", "BLOCK_H": 16,
            "BLOCK_R": 64}, 4) for style in ("neox", "gptj")],
        *[(f"fused_qk_norm_rope_{style}", fused_qk_norm_rope._qk_norm_rope_kernel,
           {"QKV": _Ptr(BF16), "QW": _Ptr(BF16), "KW": _Ptr(BF16), "CACHE": _Ptr(BF16), "POS": _Ptr("*i64"),
            "stride_t": 4096, "stride_p": 1, "num_q_heads": 16, "num_qk_heads": 24, "D": 128, "eps": 1e-6,
            "max_position": 40960, "HALF": 64, "IS_NEOX": style == "neox", "BLOCK_H": 16, "BLOCK_R": 64,
            "BLOCK_P": 0, "PDL": False}, 4) for style in ("neox", "gptj")],
    ]


@pytest.mark.parametrize(("name", "kernel", "args", "warps"), _row_kernels(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_bandwidth_kernels_vectorize_without_spills(name: str, kernel: Any, args: dict[str, Any], warps: int) -> None:
    _fast_memory(_compile(kernel, args, warps))


@pytest.mark.parametrize("config", gemm._LARGE, ids=lambda c: "x".join(str(c.kwargs[k]) for k in
                                                                        ("BLOCK_M", "BLOCK_N", "BLOCK_K")))
@pytest.mark.parametrize("trans_b", [True, False])
def test_gemm_large_configs_pipeline_on_tensor_cores(config: Any, trans_b: bool) -> None:
    n = 8192
    args = {"A": _Ptr(BF16), "B": _Ptr(BF16), "C": _Ptr(BF16), "BIAS": _Ptr(BF16), "OUT": _Ptr(BF16),
            "M": n, "N": n, "K": n, "stride_ab": 0, "stride_am": n, "stride_ak": 1, "stride_bb": 0,
            "stride_bk": 1 if trans_b else n, "stride_bn": n if trans_b else 1, "stride_cb": 0, "stride_cm": n,
            "stride_cn": 1, "stride_ob": n * n, "stride_om": n, "stride_on": 1, "alpha": 1.0, "beta": 0.0,
            "tune_key": 10, "HAS_C": False, "HAS_BIAS": True, "PRECISION": "tf32", "WIDE": False, "EVEN_K": True,
            "HINT_M": True, "HINT_N": True, **config.kwargs}
    compiled = _compile(gemm._gemm_kernel, args, config.num_warps, config.num_stages)
    assert _count(compiled, r"wgmma\.mma_async") > 0
    assert _count(compiled, r"cp\.async\.cg") > 0  # operands stream through shared memory asynchronously
    assert _count(compiled, r"(ld|st)\.local") == 0
    assert compiled.metadata.shared <= SMEM_LIMIT


@pytest.mark.parametrize("config", [*_gemv._ONE_ROW, *_gemv._FEW_ROWS],
                         ids=lambda c: f"{c.kwargs['BLOCK_N']}x{c.kwargs['BLOCK_K']}_{c.num_warps}w{c.num_stages}s")
def test_gemv_configs_stream_the_weight_in_vectors(config: Any) -> None:
    """The decode Gemm at the Qwen3-0.6B down projection (K 3072 -> N 1024): 16-byte loads of the weight, no
    spills; the 16-row configurations multiply on tensor cores; the split-K ones count the splits done."""
    one_row = config in _gemv._ONE_ROW
    args = {"X": _Ptr(BF16), "W": _Ptr(BF16), "C": _Ptr(BF16), "BIAS": _Ptr(BF16), "OUT": _Ptr(BF16),
            "PART": _Ptr(F32), "COUNTER": _Ptr("*i32"), "M": 1,
            "N": 1024, "K": 3072, "stride_xm": 3072, "stride_wn": 3072, "stride_cm": 1024, "stride_cn": 1,
            "stride_om": 1024, "stride_on": 1, "alpha": 1.0, "beta": 1.0, "HAS_C": True, "HAS_BIAS": False,
            "PRECISION": "tf32", "BLOCK_M": 1 if one_row else 16, "EVEN_K": True, "PDL": False, "SWIGLU": False,
            **_NO_ADD_NORM, **config.kwargs}
    compiled = _compile(_gemv._gemv_kernel, args, config.num_warps, config.num_stages)
    if one_row:  # straight to registers
        assert _count(compiled, r"ld\.global[.\w:]*\.v4") > 0, "no 16-byte vector loads"
    else:  # the tl.dot operands stream into shared memory, 16 bytes a copy
        assert _count(compiled, r"cp\.async\.cg\.shared\.global[.\w]* \[[^]]*\], \[[^]]*\], 0x10") > 0
        assert _count(compiled, r"mma") > 0
    assert _count(compiled, r"(ld|st)\.local") == 0
    if config.kwargs["SPLIT_K"] > 1:
        assert _count(compiled, r"atom\.[.\w]*add") > 0  # the last split of a tile sums them
    assert compiled.metadata.shared <= SMEM_LIMIT


_NO_ADD_NORM = {"R": _Ptr(BF16), "NW": _Ptr(BF16), "stride_rm": 1024, "eps": 1e-6, "ADD_NORM": False,
                "NORM_ROWS": 1, "NORM_BLOCK": 16, "NORM_ONE_PASS": False, "PRE_NORM": False}


def _add_norm_cases() -> list[tuple[Any, int, int, int]]:
    """(variant, BLOCK_M, N, K) of `gemm_add_rms_norm`'s GEMV: the autotuned candidates at one row and 16 rows, the
    sweep's tile variants at 64 rows (the most registers beside the row norm), at the Qwen3-0.6B o and down
    projections (K 2048 and 3072 -> N 1024) and Mamba-2-130m's out_proj (1536 -> 768); the row norm in two passes
    at Llama-3-8B's down projection (14336 -> 4096)."""
    shapes = ((1024, 2048), (1024, 3072), (768, 1536))
    return ([(v, 1, n, k) for v in _gemv.SWEEP_ONE_ROW[:len(_gemv._ONE_ROW)] for n, k in shapes]
            + [(v, 16, n, k) for v in _gemv.SWEEP_TILE[:len(_gemv._FEW_ROWS)] for n, k in shapes]
            + [(v, 64, 1024, 3072) for v in _gemv.SWEEP_TILE]
            + [(_gemv.SWEEP_ONE_ROW[0], 1, 4096, 14336), (_gemv.SWEEP_TILE[0], 16, 4096, 14336)])  # two passes


@pytest.mark.parametrize(("variant", "block_m", "n", "k"), _add_norm_cases(),
                         ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else str(p))
def test_gemv_add_norm_epilogue_compiles_without_spills(variant: Any, block_m: int, n: int, k: int) -> None:
    """`gemm_add_rms_norm`'s GEMV (ADD_NORM): it compiles, ptxas spills nothing, shared memory fits, the weight
    streams as in the plain product (16-byte loads, or cp.async tiles on tensor cores), and the column tiles count
    themselves done on the counter (an atomic add) before the last one normalizes the rows."""
    config = variant.config()
    norm = _gemv._norm_blocks(block_m, block_m, n)
    args = {"X": _Ptr(BF16), "W": _Ptr(BF16), "C": _Ptr(BF16), "BIAS": _Ptr(BF16), "OUT": _Ptr(BF16),
            "PART": _Ptr(F32), "COUNTER": _Ptr("*i32"), "R": _Ptr(BF16), "NW": _Ptr(BF16), "M": 1, "N": n, "K": k,
            "stride_xm": k, "stride_wn": k, "stride_cm": n, "stride_cn": 1, "stride_om": n, "stride_on": 1,
            "stride_rm": n, "alpha": 1.0, "beta": 0.0, "eps": 1e-6, "HAS_C": False, "HAS_BIAS": False,
            "PRECISION": "tf32", "BLOCK_M": block_m, "EVEN_K": k % (variant.block_k * variant.split_k) == 0,
            "PDL": True, "SWIGLU": False, "ADD_NORM": True, "PRE_NORM": False, **norm, **config.kwargs}
    compiled = _compile(_gemv._gemv_kernel, args, config.num_warps, config.num_stages)
    if block_m == 1 and variant.pipe == 1:
        assert _count(compiled, r"ld\.global[.\w:]*\.v4") > 0, "no 16-byte vector loads"
    else:
        assert _count(compiled, r"cp\.async\.cg\.shared\.global[.\w]* \[[^]]*\], \[[^]]*\], 0x10") > 0
        assert _count(compiled, r"mma") > 0
    assert _count(compiled, r"atom\.[.\w]*add") > 0
    assert _ptxas_spills(compiled) == 0
    assert compiled.metadata.shared <= SMEM_LIMIT


def _pre_norm_cases() -> list[tuple[Any, int, int, int, bool]]:
    """(variant, BLOCK_M, N, K, SWIGLU) of `rms_norm_gemm`'s GEMV: the autotuned candidates at one row and 16 rows,
    the sweep's tile variants at 64 rows, at the Qwen3-0.6B qkv and gate_up projections (K 1024 -> N 4096, and 2 x
    3072 with SWIGLU) and Mamba-2-130m's in_proj (768 -> 3352)."""
    shapes = ((4096, 1024, False), (3072, 1024, True), (3352, 768, False))
    return ([(v, 1, n, k, sw) for v in _gemv.SWEEP_ONE_ROW[:len(_gemv._ONE_ROW)] for n, k, sw in shapes]
            + [(v, 16, n, k, sw) for v in _gemv.SWEEP_TILE[:len(_gemv._FEW_ROWS)] for n, k, sw in shapes]
            + [(v, 64, 3072, 1024, True) for v in _gemv.SWEEP_TILE])


@pytest.mark.parametrize(("variant", "block_m", "n", "k", "swiglu"), _pre_norm_cases(),
                         ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else str(p))
def test_gemv_pre_norm_prologue_compiles_without_spills(variant: Any, block_m: int, n: int, k: int,
                                                        swiglu: bool) -> None:
    """`rms_norm_gemm`'s GEMV (PRE_NORM): it compiles, ptxas spills nothing, shared memory fits, the weight streams
    as in the plain product (16-byte loads, or cp.async tiles on tensor cores), and no program waits on a counter
    beyond the split-K one (no atomic unless the K range is split)."""
    config = variant.config()
    args = {"X": _Ptr(BF16), "W": _Ptr(BF16), "C": _Ptr(BF16), "BIAS": _Ptr(BF16), "OUT": _Ptr(BF16),
            "PART": _Ptr(F32), "COUNTER": _Ptr("*i32"), "R": _Ptr(BF16), "NW": _Ptr(BF16), "M": 1, "N": n, "K": k,
            "stride_xm": k, "stride_wn": k, "stride_cm": n, "stride_cn": 1, "stride_om": n, "stride_on": 1,
            "stride_rm": n, "alpha": 1.0, "beta": 0.0, "eps": 1e-6, "HAS_C": False, "HAS_BIAS": False,
            "PRECISION": "tf32", "BLOCK_M": block_m, "EVEN_K": k % (variant.block_k * variant.split_k) == 0,
            "PDL": True, "SWIGLU": swiglu, **_NO_ADD_NORM, "PRE_NORM": True,
            **config.kwargs}
    compiled = _compile(_gemv._gemv_kernel, args, config.num_warps, config.num_stages)
    if block_m == 1 and variant.pipe == 1:
        assert _count(compiled, r"ld\.global[.\w:]*\.v4") > 0, "no 16-byte vector loads"
    else:
        assert _count(compiled, r"cp\.async\.cg\.shared\.global[.\w]* \[[^]]*\], \[[^]]*\], 0x10") > 0
        assert _count(compiled, r"mma") > 0
    if variant.split_k == 1:
        assert _count(compiled, r"atom\.") == 0
    assert _ptxas_spills(compiled) == 0
    assert compiled.metadata.shared <= SMEM_LIMIT


def _sweep_variants() -> list[tuple[Any, int, bool]]:
    """(variant, BLOCK_M, SWIGLU) of the GPU sweep's candidates not compiled above: the new one-row variants plain
    and with SWIGLU (the autotuned ones with it too), the new tile variants at 16 rows, all of them at 64 rows
    (the most registers and shared memory), plain and with SWIGLU."""
    one, tile = _gemv.SWEEP_ONE_ROW, _gemv.SWEEP_TILE
    return ([(v, 1, False) for v in one[len(_gemv._ONE_ROW):]] + [(v, 1, True) for v in one]
            + [(v, 16, False) for v in tile[len(_gemv._FEW_ROWS):]]
            + [(v, 64, swiglu) for v in tile for swiglu in (False, True)])


@pytest.mark.parametrize(("variant", "block_m", "swiglu"), _sweep_variants(),
                         ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else str(p))
def test_gemv_sweep_variants_compile_without_spills(variant: Any, block_m: int, swiglu: bool) -> None:
    """Each variant `benchmarks/gpu_sweep_gemv.py` times, at the Qwen3-0.6B gate_up shape (SwiGLU: K 1024 -> 2 x
    3072) or the down projection (K 3072 -> 1024): it compiles, ptxas spills nothing, shared memory fits; the
    one-row loop loads 16-byte vectors straight to registers (evict-first where asked), or stages through shared
    memory with cp.async when pipelined; the tiles multiply on tensor cores."""
    n, k = (3072, 1024) if swiglu else (1024, 3072)
    config = variant.config()
    args = {"X": _Ptr(BF16), "W": _Ptr(BF16), "C": _Ptr(BF16), "BIAS": _Ptr(BF16), "OUT": _Ptr(BF16),
            "PART": _Ptr(F32), "COUNTER": _Ptr("*i32"), "M": 1, "N": n, "K": k, "stride_xm": k, "stride_wn": k,
            "stride_cm": n, "stride_cn": 1, "stride_om": n, "stride_on": 1, "alpha": 1.0, "beta": 0.0,
            "HAS_C": False, "HAS_BIAS": swiglu, "PRECISION": "tf32", "BLOCK_M": block_m,
            "EVEN_K": k % (variant.block_k * variant.split_k) == 0, "PDL": False, "SWIGLU": swiglu,
            **_NO_ADD_NORM, **config.kwargs}
    compiled = _compile(_gemv._gemv_kernel, args, config.num_warps, config.num_stages)
    if block_m == 1 and variant.pipe == 1:
        assert _count(compiled, r"ld\.global[.\w:]*\.v4") > 0, "no 16-byte vector loads"
        assert (_count(compiled, r"evict_first") > 0) == variant.evict
    else:
        assert _count(compiled, r"cp\.async\.cg\.shared\.global[.\w]* \[[^]]*\], \[[^]]*\], 0x10") > 0
    if block_m > 1:
        assert _count(compiled, r"mma") > 0
    assert _ptxas_spills(compiled) == 0
    assert compiled.metadata.shared <= SMEM_LIMIT


_TABLE_CASES = [(key, False) for key in sorted(_gemv.TABLE)] + [  # and with the residual add + norm where N is
    (key, True) for key in sorted(_gemv.TABLE) if not key[3] and key[1] in (768, 1024)]  # a hidden size


@pytest.mark.parametrize(("key", "add_norm"), _TABLE_CASES,
                         ids=lambda p: "m{}-n{}-k{}{}".format(*p[:3], "-swiglu" * p[3]) if isinstance(p, tuple)
                         else "add_norm" * p)
def test_gemv_table_entries_compile_at_their_shape_without_spills(key: tuple[int, int, int, bool],
                                                                  add_norm: bool) -> None:
    """Each committed `_gemv.TABLE` entry is one of the sweep's variants and compiles for sm_90 at the shape it is
    kept for (its row class, N, K, SwiGLU), the o / down / out_proj shapes also with `gemm_add_rms_norm`'s
    epilogue (which takes the plain product's entry): no ptxas spill, shared memory fits."""
    rows, n, k, swiglu = key
    variant = _gemv.TABLE[key]
    assert variant in (*_gemv.SWEEP_ONE_ROW, *_gemv.SWEEP_TILE)
    config = variant.config()
    args = {"X": _Ptr(BF16), "W": _Ptr(BF16), "C": _Ptr(BF16), "BIAS": _Ptr(BF16), "OUT": _Ptr(BF16),
            "PART": _Ptr(F32), "COUNTER": _Ptr("*i32"), "M": rows, "N": n, "K": k, "stride_xm": k,
            "stride_wn": k, "stride_cm": n, "stride_cn": 1, "stride_om": n, "stride_on": 1, "alpha": 1.0,
            "beta": 0.0, "HAS_C": False, "HAS_BIAS": swiglu, "PRECISION": "tf32", "BLOCK_M": rows,
            "EVEN_K": k % (variant.block_k * variant.split_k) == 0, "PDL": False, "SWIGLU": swiglu,
            **_NO_ADD_NORM, **config.kwargs}
    if add_norm:
        args.update(ADD_NORM=True, stride_rm=n, **_gemv._norm_blocks(rows, rows, n))
    compiled = _compile(_gemv._gemv_kernel, args, config.num_warps, config.num_stages)
    assert _ptxas_spills(compiled) == 0
    assert compiled.metadata.shared <= SMEM_LIMIT


def test_decode_kernels_wait_for_the_previous_kernel_under_programmatic_dependent_launch() -> None:
    """With PDL each decode-step kernel first lets the next one launch, then waits for the previous one's
    results (griddepcontrol), before any other instruction touches memory."""
    config = _gemv._ONE_ROW[0]
    args = {"X": _Ptr(BF16), "W": _Ptr(BF16), "C": _Ptr(BF16), "BIAS": _Ptr(BF16), "OUT": _Ptr(BF16),
            "PART": _Ptr(F32), "COUNTER": _Ptr("*i32"), "M": 1, "N": 1024, "K": 3072, "stride_xm": 3072,
            "stride_wn": 3072, "stride_cm": 1024, "stride_cn": 1, "stride_om": 1024, "stride_on": 1, "alpha": 1.0,
            "beta": 0.0, "HAS_C": False, "HAS_BIAS": False, "PRECISION": "tf32", "BLOCK_M": 1, "EVEN_K": True,
            "PDL": True, "SWIGLU": False, **_NO_ADD_NORM, **config.kwargs}
    ptx = _compile(_gemv._gemv_kernel, args, config.num_warps, config.num_stages).asm["ptx"]
    launch, wait = ptx.find("griddepcontrol.launch_dependents"), ptx.find("griddepcontrol.wait")
    assert 0 <= launch < wait < ptx.find("ld.global")
    norm = {"X": _Ptr(BF16), "W": _Ptr(BF16), "Y": _Ptr(BF16), "T": 1, "H": 1024, "stride_x": 1024, "stride_y": 1024,
            "eps": 1e-6, "ROWS": 1, "BLOCK": 1024, "PDL": True}
    assert "griddepcontrol.wait" in _compile(rms_norm._rms_norm_kernel, norm, 4).asm["ptx"]


def _conv_args(channel_last: bool, **overrides: Any) -> dict[str, Any]:
    d, length, w = 4096, 4096, 4
    x = {"stride_xb": d * length, "stride_xd": 1 if channel_last else length, "stride_xl": d if channel_last else 1}
    out = {"stride_ob": d * length, "stride_od": x["stride_xd"], "stride_ol": x["stride_xl"]}
    args = {"X": _Ptr(BF16), "WEIGHT": _Ptr(BF16), "BIAS": _Ptr(BF16), "SEQ": _Ptr("*i32"), "INIT": _Ptr(BF16),
            "OUT": _Ptr(BF16), "FINAL": _Ptr(BF16), "D": d, "L": length, **x, "stride_wd": w, "stride_ww": 1,
            "stride_sb": 0, "stride_sl": 0, "stride_ib": 0, "stride_id": 0, "stride_iw": 0, **out,
            "stride_fb": 0, "stride_fd": 0, "stride_fw": 0, "W": w, "HAS_BIAS": True, "SILU": True,
            "HAS_SEQ": False, "HAS_INIT": False, "HAS_FINAL": False, "WIDE": False, "BLOCK_W": 4,
            "BLOCK_D": 64 if channel_last else 16, "BLOCK_L": 64 if channel_last else 256}
    return {**args, **overrides}


@pytest.mark.parametrize("config", causal_conv1d._CHANNEL_FIRST_CANDIDATES,
                         ids=lambda c: f"{c.kwargs['BLOCK_D']}x{c.kwargs['BLOCK_L']}_{c.num_warps}w")
def test_conv_channel_first_taps_stay_in_registers(config: Any) -> None:
    args = {k: v for k, v in _conv_args(False, size_class=13, **config.kwargs).items()
            if k not in ("SEQ", "stride_sb", "stride_sl", "HAS_SEQ")}
    compiled = _compile(causal_conv1d._conv_channel_first_kernel, args, config.num_warps)
    _fast_memory(compiled)
    assert _count(compiled, r"(ld|st)\.shared") == 0 and _count(compiled, r"shfl") == 0


def _channel_last_args(**overrides: Any) -> dict[str, Any]:
    drop = ("SEQ", "stride_sb", "stride_sl", "HAS_SEQ", "BLOCK_L")
    return {k: v for k, v in _conv_args(True, BLOCK_D=1024, **overrides).items() if k not in drop}


def test_conv_channel_last_reads_rows_once_into_registers() -> None:
    # 8 rows + the W-1 halo rows + the bias: 12 vector loads, 8 vector stores, nothing through shared memory
    compiled = _compile(causal_conv1d._conv_channel_last_kernel, _channel_last_args(), 4)
    _fast_memory(compiled)
    assert _count(compiled, r"ld\.global[.\w:]*\.v4") == 12
    assert _count(compiled, r"st\.global[.\w:]*\.v4") == 8
    assert _count(compiled, r"(ld|st)\.shared") == 0


def test_conv_generic_kernel_vectorizes_channel_last() -> None:  # the seq_idx path
    _fast_memory(_compile(causal_conv1d._conv_kernel, _conv_args(True, HAS_SEQ=True, stride_sb=4096, stride_sl=1),
                          8))


def test_conv_kernels_compile_with_every_flag() -> None:
    flags = {"HAS_SEQ": True, "HAS_INIT": True, "HAS_FINAL": True, "WIDE": True, "stride_sb": 4096, "stride_sl": 1,
             "stride_ib": 3 * 4096, "stride_id": 3, "stride_iw": 1, "stride_fb": 3 * 4096, "stride_fd": 3,
             "stride_fw": 1}
    _compile(causal_conv1d._conv_kernel, _conv_args(True, **flags), 8)
    wide = {k: v for k, v in _conv_args(False, W=8, BLOCK_W=8, size_class=13, **flags).items()
            if k not in ("SEQ", "stride_sb", "stride_sl", "HAS_SEQ")}
    _compile(causal_conv1d._conv_channel_first_kernel, wide, 8)
    last = _channel_last_args(W=8, BLOCK_W=8,
                              **{k: v for k, v in flags.items() if k not in ("HAS_SEQ", "stride_sb", "stride_sl")})
    assert _count(_compile(causal_conv1d._conv_channel_last_kernel, last, 4), r"(ld|st)\.local") == 0
    update = {"X": _Ptr(BF16), "STATE": _Ptr(BF16), "WEIGHT": _Ptr(BF16), "BIAS": _Ptr(BF16),
              "INDEX": _Ptr("*i32"), "SEQLENS": _Ptr("*i32"), "OUT": _Ptr(BF16), "D": 4096, "L": 1, "S": 14,
              "slots": 80,
              "stride_xb": 4096, "stride_xd": 1, "stride_xl": 1, "stride_cs": 14 * 4096, "stride_cd": 1,
              "stride_cl": 4096, "stride_wd": 4, "stride_ww": 1, "stride_ob": 4096, "stride_od": 1, "stride_ol": 1,
              "W": 4, "HAS_BIAS": True, "SILU": True, "HAS_INDEX": True, "CIRCULAR": True, "BLOCK_D": 256, "BLOCK_L": 1,
              "BLOCK_S": 16}
    _compile(causal_conv1d._update_kernel, update, 4)


F32 = "*fp32"


def _attention_sizes(d: int, precision: str) -> dict[str, Any]:
    return {"stride_kb": 0, "stride_kh": d, "stride_vb": 0, "stride_vh": d, "stride_oh": d, "stride_btb": 0,
            "num_heads_q": 32, "kv_group": 4, "max_blocks": 0, "num_pages": 0, "qk_scale": 0.1, "softcap_scale": 0.0,
            "window_left": 0, "window_right": 0, "HEAD_DIM": d, "BLOCK_D": d, "HAS_LEFT": False, "HAS_RIGHT": True,
            "SOFTCAP": False, "PAGED": False, "PAGE_SIZE": 1, "PRECISION": precision}


def _prefill_args(d: int, ptr: str, precision: str, config: Any) -> dict[str, Any]:
    """`attn_fwd_kernel`'s arguments at 4 x 32 query / 8 kv heads x 4096 tokens, contiguous K/V."""
    return {"Q": _Ptr(ptr), "K": _Ptr(ptr), "V": _Ptr(ptr), "Out": _Ptr(ptr), "CuQ": _Ptr("*i32"),
            "CuK": _Ptr("*i32"), "BlockTable": _Ptr("*i32"), "stride_qt": 32 * d, "stride_qh": d, "stride_kt": 8 * d,
            "stride_vt": 8 * d, "stride_ot": 32 * d, "num_bh": 128, "max_seqlen_q": 4096, "GROUP": 8,
            "total_q": 4 * 4096, "total_k": 4 * 4096,
            "SeqUsedK": _Ptr("*i32"), "Lse": _Ptr(F32), "stride_lse_h": 0, "HAS_SEQUSED": False, "HAS_LSE": False,
            **_attention_sizes(d, precision), **config.kwargs}


def _decode_args(d: int, ptr: str, precision: str, config: Any, **overrides: Any) -> dict[str, Any]:
    """`decode_split_kernel`'s arguments for one query over 4096 cached tokens, 32/8 heads, split-K."""
    return {"Q": _Ptr(ptr), "KCache": _Ptr(ptr), "VCache": _Ptr(ptr), "CacheSeqlens": _Ptr("*i32"),
            "BlockTable": _Ptr("*i32"), "Out": _Ptr(ptr), "OPart": _Ptr(F32), "LsePart": _Ptr(F32),
            "stride_qb": 32 * d, "stride_qt": 32 * d, "stride_qh": d, "stride_kb": 4096 * 8 * d, "stride_kt": 8 * d,
            "stride_vb": 4096 * 8 * d, "stride_vt": 8 * d, "stride_ob": 32 * d, "stride_ot": 32 * d,
            "num_heads_kv": 8, "q_len": 1, "new_len": 0, "capacity": 4096, "num_m_tiles": 1, "num_splits": 16,
            "BLOCK_M": 64, "SPLIT": True, "CacheBatchIdx": _Ptr("*i32"), "Lse": _Ptr(F32), "stride_lse_b": 0,
            "stride_lse_h": 0, "num_rows": 64, "HAS_BATCH_IDX": False, "HAS_LSE": False, "Counter": _Ptr("*i32"),
            "min_split_blocks": 1, "tune_size": 1024 + 16, "FUSED": True, "PDL": False, "APPEND": False,
            "NEW_FIRST": False,
            "KNew": _Ptr(ptr), "VNew": _Ptr(ptr),
            "stride_nb": 8 * d, "stride_nt": 8 * d, "stride_nh": d, "stride_vnb": 8 * d, "stride_vnt": 8 * d,
            "stride_vnh": d, **_attention_sizes(d, precision), **config.kwargs, **overrides}


def _fp64_scores_fit(compiled: Any) -> None:
    assert _count(compiled, r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f64") > 0  # FP64 tensor cores
    assert _count(compiled, r"(ld|st)\.local") == 0
    assert compiled.metadata.shared <= SMEM_LIMIT


@pytest.mark.parametrize("config", range(5))
def test_bf16_prefill_configurations_run_on_tensor_cores(config: int) -> None:
    from infiniops_triton import _flash_attn_kernels as fk

    # the five the autotuner times on the common path: wgmma dots, TMA loads exactly where asked
    cfg = fk._prefill_configs()[config]
    compiled = _compile(fk.attn_fwd_kernel, _prefill_args(128, BF16, "tf32", cfg), cfg.num_warps, cfg.num_stages)
    assert _count(compiled, r"wgmma\.mma_async") > 0
    assert (_count(compiled, r"cp\.async\.bulk\.tensor") > 0) == cfg.kwargs["USE_TMA"]
    assert compiled.metadata.shared <= SMEM_LIMIT


def _fixed_prefill_configs() -> dict[str, dict[str, Any]]:
    """The fixed configurations of the prefill launch: the `PREFILL_DEFAULTS` rows and the variants of
    benchmarks/gpu_sweep_prefill.py, at D 64 and 128, causal and not, with the launcher's defaults filled in."""
    from infiniops_triton import flash_attn as tfa

    path = Path(__file__).parents[1] / "benchmarks" / "gpu_sweep_prefill.py"
    spec = importlib.util.spec_from_file_location("gpu_sweep_prefill", path)
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    found = {}
    for d in (64, 128):
        settings = [row[2] for row in tfa.PREFILL_DEFAULTS if row[2] and d <= row[0]]
        settings += [v for label, v in sweep.VARIANTS.items() if v and sweep.runs_at(label, d)]
        for causal in (True, False):
            for given in settings:
                c = tfa._check_prefill_config(given, True)
                name = (f"d{d}_{'causal' if causal else 'full'}_{c['BLOCK_M']}x{c['BLOCK_N']}_{c.get('num_warps', 4)}w"
                        f"{c.get('num_stages', 3)}s{'_lazy' if c['LAZY'] else ''}{'_tma' if c['USE_TMA'] else ''}")
                found[name] = {**c, "d": d, "causal": causal}
    return found


_FIXED_PREFILL = _fixed_prefill_configs()


def _compile_prefill(s: dict[str, Any], **flags: Any) -> Any:
    from infiniops_triton import _flash_attn_kernels as fk

    kernel = {k: s[k] for k in ("BLOCK_M", "BLOCK_N", "LAZY", "USE_TMA")}
    args = {**_prefill_args(s["d"], BF16, "tf32", triton.Config(kernel)), "HAS_RIGHT": s["causal"], **flags}
    return _compile(fk.attn_fwd_kernel, args, s.get("num_warps", 4), s.get("num_stages", 3))


@pytest.mark.parametrize("name", sorted(_FIXED_PREFILL))
def test_bf16_prefill_fixed_configurations_fit_without_spills(name: str) -> None:
    """Each fixed configuration the prefill launcher or the sweep may run (4 x 32/8 heads x 4096 tokens): wgmma
    dots, TMA loads exactly where asked, no register spills, within shared memory; the warp-specialized ones
    split into a producer and two consumer warpgroups (3 x num_warps warps, registers moved by setmaxnreg)."""
    s = _FIXED_PREFILL[name]
    compiled = _compile_prefill(s)
    assert _count(compiled, r"wgmma\.mma_async") > 0
    assert (_count(compiled, r"cp\.async\.bulk\.tensor") > 0) == s["USE_TMA"]
    assert _count(compiled, r"(ld|st)\.local") == 0
    assert _ptxas_spills(compiled) == 0
    assert compiled.metadata.shared <= SMEM_LIMIT


@pytest.mark.parametrize("config", range(7))
def test_bf16_paged_decode_configurations_run_on_tensor_cores(config: int) -> None:
    from infiniops_triton import _decode_kernels as dk

    cfg = dk._decode_configs()[config]  # every one the autotuner may time for 16-bit inputs at D 128
    args = _decode_args(128, BF16, "tf32", cfg, BLOCK_M=16, PAGED=True, PAGE_SIZE=16, APPEND=True, new_len=1)
    compiled = _compile(dk.decode_split_kernel, args, cfg.num_warps, cfg.num_stages)
    assert _count(compiled, r"mma") > 0
    assert _count(compiled, r"atom\.[.\w]*add") > 0  # the fused combine counts the splits done
    assert compiled.metadata.shared <= SMEM_LIMIT


def _fixed_decode_configs() -> dict[str, dict[str, Any]]:
    """The fixed kernel configurations of the decode launch: the `DECODE_DEFAULTS` rows and the variants of
    benchmarks/gpu_sweep_decode.py, one per (BLOCK_N, warps, stages, maxnreg, new_first)."""
    from infiniops_triton import flash_attn as tfa

    path = Path(__file__).parents[1] / "benchmarks" / "gpu_sweep_decode.py"
    spec = importlib.util.spec_from_file_location("gpu_sweep_decode", path)
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    found = {}
    for d in (64, 128, 256):  # the launcher's table at the head dims of the supported models, the sweep's at 128
        settings = [tfa.decode_settings(programs, 1 << 20, 2, d) for programs in sorted({r[0] for r in
                                                                                           tfa.DECODE_DEFAULTS})]
        if d == 128:
            settings += [v for v in sweep.VARIANTS.values() if v is not None]
        for s in settings:
            if "BLOCK_N" in s:
                key = (d, s["BLOCK_N"], s["num_warps"], s["num_stages"], s.get("maxnreg"), bool(s.get("new_first")))
                found["d{}_{}/{}w/{}s_reg{}_new{}".format(*key)] = {**s, "d": d}
    return found


_FIXED_DECODE = _fixed_decode_configs()


@pytest.mark.parametrize("name", sorted(_FIXED_DECODE))
def test_bf16_paged_decode_fixed_configurations_fit_without_spills(name: str) -> None:
    """Each fixed configuration the launcher or the sweep may run (appending, fused split-K): tensor-core
    dots, no register spills, within shared memory and within its register limit."""
    from infiniops_triton import _decode_kernels as dk

    s = _FIXED_DECODE[name]
    args = _decode_args(s["d"], BF16, "tf32", triton.Config({}), BLOCK_M=16, PAGED=True, PAGE_SIZE=16, APPEND=True,
                        new_len=1, BLOCK_N=s["BLOCK_N"], NEW_FIRST=bool(s.get("new_first")))
    compiled = _compile(dk.decode_split_kernel, args, s["num_warps"], s["num_stages"], maxnreg=s.get("maxnreg"))
    assert _count(compiled, r"mma") > 0
    assert _count(compiled, r"(ld|st)\.local") == 0
    assert _ptxas_spills(compiled) == 0
    assert compiled.metadata.shared <= SMEM_LIMIT
    if s.get("maxnreg"):
        assert _ptxas_report(compiled, r"Used (\d+) registers") <= s["maxnreg"]


@pytest.mark.parametrize("d", [64, 128, 256])
def test_float32_prefill_scores_in_float64_fit_the_configuration_it_takes(d: int) -> None:
    from infiniops_triton import _flash_attn_kernels as fk

    # float32 takes the first configuration whose float32 tiles fit the budget, through pointers (no TMA)
    config = next(c for c in fk._prefill_configs() if not c.kwargs["USE_TMA"]
                  and fk._prefill_smem(c, d, 4) <= fk.SMEM_BUDGET)
    compiled = _compile(fk.attn_fwd_kernel, _prefill_args(d, F32, "fp64", config), config.num_warps,
                        config.num_stages)
    _fp64_scores_fit(compiled)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_float32_decode_scores_in_float64_fit_the_configuration_it_takes(d: int) -> None:
    from infiniops_triton import _decode_kernels as dk
    from infiniops_triton._flash_attn_kernels import SMEM_BUDGET

    config = next(c for c in dk._decode_configs() if c.num_stages * 2 * c.kwargs["BLOCK_N"] * d * 4 <= SMEM_BUDGET)
    compiled = _compile(dk.decode_split_kernel, _decode_args(d, F32, "fp64", config), config.num_warps,
                        config.num_stages)
    _fp64_scores_fit(compiled)


# --- the Mamba-2 SSD kernels and the state update, at the Mamba-2-130m layer shape ---------------------------

_SSD_N = 128  # d_state
_SSD_FLOATS = {"a_ptr", "dt_bias_ptr", "d_ptr", "states_ptr", "init_ptr", "final_ptr", "carry_ptr", "dt_out_ptr",
               "cs_out_ptr", "cb_ptr", "dt_ptr_f32", "cs_ptr", "state_ptr", "seg_out_ptr"}
_SSD_INTS = {"seq_idx_ptr": "*i32", "seg_ptr": "*i32", "index_ptr": "*i64", "table_ptr": "*i32"}


def _ssd(kernel: Any, dtype: str, consts: dict[str, Any], warps: int, stages: int, floats: tuple[str, ...] = (),
         maxnreg: int | None = None) -> dict[str, Any]:
    """Compile an SSD kernel: pointers 16-byte aligned (fp32 where the kernel keeps fp32 buffers, else
    `dtype`), sizes and strides unspecialized, `consts` as given; what the checks below read."""
    fn = kernel
    while not isinstance(fn, triton.runtime.jit.JITFunction):
        fn = fn.fn
    args: dict[str, Any] = {}
    for name in fn.arg_names:
        if name in consts:
            args[name] = consts[name]
        elif name.endswith("_ptr"):
            fp32 = name in _SSD_FLOATS or name in floats
            args[name] = _Ptr(_SSD_INTS.get(name) or ("*fp32" if fp32 else f"*{dtype}"))
        else:
            args[name] = 0.5 if name in ("dt_lo", "dt_hi") else 3  # an int neither 1 nor a multiple of 16
    compiled = _compile(fn, args, warps, stages, maxnreg)
    ptx = compiled.asm["ptx"]
    return {"kernel": fn.__name__, "dtype": dtype, "shared": compiled.metadata.shared,
            "mma": "mma.sync" in ptx or "wgmma.mma_async" in ptx, "spills": _ptxas_spills(compiled),
            "capped": maxnreg is not None}


def _ssd_kernels() -> list[dict[str, Any]]:
    from infiniops_triton import _ssd_bmm, _ssd_chunk_scan, _ssd_chunk_state, _ssd_state_passing, state_update
    from infiniops_triton import selective_scan as triton_scan

    out = []
    state_flags = {"stride_x_p": 1, "stride_b_n": 1, "CHUNK": 256, "HAS_DT_BIAS": True, "DT_SOFTPLUS": True,
                   "PRODUCT": 0}
    scan_flags = {"stride_x_p": 1, "stride_c_n": 1, "CHUNK": 256, "HAS_D": True, "BLOCK_N": _SSD_N,
                  "FACTORED": _ssd_chunk_scan.FACTORED}
    torch_dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    for dtype, prec in (("bf16", "tf32"), ("fp16", "tf32"), ("fp32", "tf32x3")):
        forms = {"PRODUCT": _ssd_chunk_scan.PRODUCT.get(torch_dtypes[dtype], 0),  # the module's defaults
                 "STATE_PRODUCT": _ssd_chunk_scan.STATE_PRODUCT.get(torch_dtypes[dtype], 0)}
        seq = dtype != "bf16"  # the benchmark's path without seq_idx, the others with every flag on
        configs = slice(None) if dtype == "bf16" else slice(1)  # every tuned config in bf16, the first one else
        for cfg in _ssd_chunk_state._chunk_state_kernel.configs[configs]:
            out.append(_ssd(_ssd_chunk_state._chunk_state_kernel, dtype,
                            {**state_flags, "HAS_SEQ_IDX": seq, "VARLEN": seq, "DOT_PRECISION": prec, **cfg.kwargs},
                            cfg.num_warps, cfg.num_stages, maxnreg=cfg.maxnreg))
        for cfg in _ssd_chunk_scan._chunk_scan_kernel.configs[configs]:
            flags = {**scan_flags, **forms, "HAS_Z": True, "HAS_SEQ_IDX": seq, "HAS_INIT": seq, "DOT_PRECISION": prec,
                     "VARLEN": seq, "PRESPLIT": dtype != "fp32" and triton_scan.PRESPLIT, **cfg.kwargs}
            out.append(_ssd(_ssd_chunk_scan._chunk_scan_kernel, dtype, flags, cfg.num_warps, cfg.num_stages,
                            floats=("dt_ptr",), maxnreg=cfg.maxnreg))
        out.append(_ssd(_ssd_bmm._chunk_cb_kernel, dtype, {"stride_c_n": 1, "stride_b_n": 1, "CHUNK": 256,
                        "VARLEN": seq, "DOT_PRECISION": prec, "BLOCK": 64, "BLOCK_N": _SSD_N}, 4, 1))
        block_p, warps = state_update.update_config(64, _SSD_N)
        out.append(_ssd(state_update._state_update_kernel, dtype,
                        {"stride_s_n": 1, "HAS_D": True, "HAS_Z": seq, "HAS_DT_BIAS": True, "DT_SOFTPLUS": True,
                         "HAS_INDICES": True, "UNTIED": seq, "EVEN": not seq, "BLOCK_P": block_p, "BLOCK_N": _SSD_N},
                        warps, 1))
    for dtype, split in (("fp32", False), ("bf16", True)):  # in place (fp32 inputs), or split for the chunk scan
        out.append(_ssd(_ssd_state_passing._state_passing_kernel, dtype,
                        {"HAS_INIT": True, "HAS_FINAL": True, "SPLIT_OUT": split, "STORE_LO": True,
                         "CHUNKS_PER_STEP": 8, "BLOCK": 256}, 4, 1,
                        floats=("states_ptr", "carry_ptr", "init_ptr", "final_ptr")))
    return out


def _ssd_variants() -> list[dict[str, Any]]:
    """The bf16 chunk-state and chunk-scan kernels of every variant benchmarks/gpu_ssd_parity.py sweeps (a whole
    launch configuration, or switches over the default one: product forms), on the benchmark's path (no
    seq_idx), and the state passing that stores the high halves alone."""
    from infiniops_triton import _ssd_chunk_scan, _ssd_chunk_state, _ssd_common, _ssd_state_passing

    path = Path(__file__).parents[1] / "benchmarks" / "gpu_ssd_parity.py"
    spec = importlib.util.spec_from_file_location("gpu_ssd_parity", path)
    assert spec is not None and spec.loader is not None
    parity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parity)
    kernels = {"chunk_state": (_ssd_chunk_state._chunk_state_kernel, _ssd_chunk_state.CONFIGS[0],
                               {"stride_x_p": 1, "stride_b_n": 1, "HAS_DT_BIAS": True, "DT_SOFTPLUS": True,
                                "HAS_SEQ_IDX": False, "VARLEN": False, "PRODUCT": 0}, ()),
               "chunk_scan": (_ssd_chunk_scan._chunk_scan_kernel, _ssd_chunk_scan.CONFIGS[0],
                              {"stride_x_p": 1, "stride_c_n": 1, "HAS_D": True, "HAS_Z": False, "HAS_SEQ_IDX": False,
                               "HAS_INIT": False, "VARLEN": False, "PRESPLIT": False, "BLOCK_N": _SSD_N,
                               "FACTORED": False, "PRODUCT": 0, "STATE_PRODUCT": 0}, ("dt_ptr",))}
    out, seen = [], set()
    for _, overrides in parity.VARIANTS:
        for name, cfg in overrides.items():
            if name not in kernels:
                continue
            kernel, default, flags, floats = kernels[name]
            launch = cfg if "num_warps" in cfg else {**default, **cfg}  # a whole configuration, or switches
            key = (name, tuple(sorted(launch.items())))
            if key in seen:
                continue
            seen.add(key)
            meta = {k: v for k, v in launch.items() if k not in ("num_warps", "num_stages", "maxnreg")}
            found = _ssd(kernel, "bf16", {**flags, "CHUNK": 256, "DOT_PRECISION": "tf32", **meta},
                         launch["num_warps"], launch["num_stages"], floats=floats, maxnreg=launch.get("maxnreg"))
            out.append({**found, "launch": launch})
    kernel, default, flags, floats = kernels["chunk_scan"]
    for state_product in (0, _ssd_common.ROUND):  # the presplit layout ("layout" variants): both halves, or the high
        meta = {k: v for k, v in default.items() if k not in ("num_warps", "num_stages", "maxnreg")}
        out.append(_ssd(kernel, "bf16", {**flags, "CHUNK": 256, "DOT_PRECISION": "tf32", **meta, "PRESPLIT": True,
                                         "STATE_PRODUCT": state_product},
                        default["num_warps"], default["num_stages"], floats=floats, maxnreg=default.get("maxnreg")))
    out.append(_ssd(_ssd_state_passing._state_passing_kernel, "bf16",
                    {"HAS_INIT": False, "HAS_FINAL": True, "SPLIT_OUT": True, "STORE_LO": False,
                     "CHUNKS_PER_STEP": 8, "BLOCK": 256}, 4, 1,
                    floats=("states_ptr", "carry_ptr", "init_ptr", "final_ptr")))
    return out


def test_ssd_kernels_fit_an_sm_and_multiply_on_tensor_cores() -> None:
    # every tuned configuration of the two big SSD kernels in bf16, the first in fp16/fp32 with every flag on,
    # the C.B^T, state-passing and state-update kernels: shared memory within an SM's 227 KB, tensor-core
    # products in the scan kernels, no register spills in 16-bit
    found = _ssd_kernels()
    # bf16: each chunk_state (1) and chunk_scan (2) config, the C.B^T and update kernels; fp16/fp32: the first
    # of each and those two; and the two state-passing variants
    assert len(found) == (1 + 2 + 2) + 2 * (1 + 1 + 2) + 2, found
    assert all(k["shared"] <= SMEM_LIMIT for k in found), found
    # uncapped 16-bit configurations never spill, fp32 (tf32x3, not a performance target) a few bytes with every
    # flag on; a register cap (maxnreg 128: 4 programs per SM) spills by design, measured faster on the H200
    # (benchmarks/gpu_sweep_scan.py: chunk_scan 0.231 ms capped with spills, 0.304 ms uncapped), within bounds
    for k in found:
        limit = 2048 if k["capped"] else 0 if k["dtype"] != "fp32" else 64
        assert 0 <= k["spills"] <= limit, k
    dots = [k for k in found if k["kernel"] != "_state_update_kernel" and "passing" not in k["kernel"]]
    assert all(k["mma"] for k in dots), dots


def test_ssd_sweep_variants_compile_within_an_sm() -> None:
    # every chunk_state / chunk_scan variant the parity benchmark sweeps (product forms split, tf32, round;
    # block shapes), and the state passing without the low halves: shared memory within an SM's 227 KB,
    # tensor-core products, spills only under a register cap (as the defaults), and within its bound
    found = _ssd_variants()
    assert len(found) >= 15, found
    assert all(k["shared"] <= SMEM_LIMIT for k in found), found
    for k in found:
        assert 0 <= k["spills"] <= (2048 if k["capped"] else 0), k
    assert all(k["mma"] for k in found if "passing" not in k["kernel"]), found


@pytest.mark.parametrize("penalized", [False, True], ids=["plain", "penalized"])
def test_the_sampling_kernel_streams_its_row_in_vectors_without_spills(penalized: bool) -> None:
    """Qwen's 151936 logits of one row over 119 programs, every step in one launch: the search levels, the
    barriers and Philox stay in registers, and the logits (and the penalized workspace) move in 16-byte
    vectors."""
    f32, i32, i64 = _Ptr("*fp32"), _Ptr("*i32"), _Ptr("*i64")
    p, chunk = 119, 1280
    args = {"LOGITS": _Ptr(BF16), "stride_l": 151936, "ROWS": i64, "TOPK": i32, "TOPP": f32, "TEMP": f32,
            "MINP": f32, "SEED": i64, "OFFSET": i64, "REP": f32, "FREQ": f32, "PRES": f32, "COUNTS": i32,
            "stride_c": 151936, "SEEN": _Ptr("*u8"), "stride_s": 151936, "WORK": f32, "SMAX": f32, "SARG": i32,
            "SFLAG": i32, "PART": f32, "DBEST": f32, "DIDX": i32, "GMAX": f32, "DW": f32, "DI": i32, "CNT": i32,
            "OUT": i32, "N": 1, "V": 151936, "P": p, "CHUNK": chunk, "NG": 594, "FIRST": 0, "LAST": sampling._STEPS - 1,
            "PENALIZED": penalized, "BLOCK": sampling._BLOCK, "GROUP": sampling._GROUP, "NGP": 1024,
            "CAP": sampling._CAP, "ITERS": sampling._ITERS, "WAYS": sampling._WAYS, "SEARCH": sampling._SEARCH,
            "PP": sampling._MAX_SPLIT}
    compiled = _compile(sampling._sample_kernel, args, sampling._WARPS)
    assert _count(compiled, r"ld\.global[.\w:]*\.v4") > 0, "no 16-byte vector loads"
    assert (_count(compiled, r"st\.global[.\w:]*\.v4") > 0) == penalized, "the workspace is not stored in vectors"
    assert _count(compiled, r"(ld|st)\.local") == 0, "registers spill to local memory"
    assert _count(compiled, r"\.acquire\.") > 0, "the barrier does not acquire"
    registers = _ptxas_report(compiled, r"Used (\d+) registers")
    assert registers * 32 * sampling._WARPS * sampling._PER_SM <= 65536, f"{registers} registers: two do not fit"
    assert _ptxas_spills(compiled) == 0
