"""Model and engine configuration: the numbers the model layer keeps from ``config.json``, and the engine options.

`ModelConfig` is what every family translates its transformers config into (`infinilm.models.registry.read_config`
reads a checkpoint's); the differences between the Llama-like families are data here (`qkv_bias`, `o_bias`,
`mlp_bias`, `qk_norm`), a recurrent family's numbers are a `Mamba2Dims`. This module imports no model.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from types import MappingProxyType
from typing import Any, Final

import torch

from infinilm.config_checks import ConfigError

__all__ = ["ConfigError", "EngineOptions", "Mamba2Dims", "ModelConfig", "parse_dtype", "token_ids"]

_DTYPES: Final[Mapping[str, torch.dtype]] = MappingProxyType({
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
})


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """``"bf16"``, ``"bfloat16"``, ``torch.bfloat16`` -> ``torch.bfloat16``.

    Raises:
        ConfigError: not one of float32, bfloat16, float16.
    """
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise ConfigError(f"dtype {value!r} is not supported; use one of float32, bfloat16, float16")
    return _DTYPES[name]


def token_ids(value: int | Sequence[int] | None) -> tuple[int, ...]:
    """A config's ``eos_token_id`` (None, one id or a list of ids) as a tuple of ints."""
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


@dataclass(frozen=True)
class Mamba2Dims:
    """The numbers of a Mamba-2 (selective state space) layer, from transformers' ``Mamba2Config``.

    Attributes:
        num_heads / head_dim / state_size / n_groups: H, P, N and G of the scans (H % G == 0).
        conv_kernel: W, the causal conv width; the conv state keeps W - 1 columns.
        chunk_size: the scan's chunk length.
        intermediate_size: d_inner = H * P = expand * hidden_size.
        use_bias / use_conv_bias: whether the projections / the conv carry a bias.
        residual_in_fp32: the residual stream is float32 whatever the model dtype.
        time_step_limit: ``(low, high)`` clamp of the processed dt.
    """

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    intermediate_size: int
    use_bias: bool
    use_conv_bias: bool
    residual_in_fp32: bool
    time_step_limit: tuple[float, float]

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: x, B and C, ``d_inner + 2 * G * N``."""
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def group_size(self) -> int:
        """Channels per group of the gated norm, ``d_inner / G``."""
        return self.intermediate_size // self.n_groups

    @property
    def proj_size(self) -> int:
        """Output width of ``in_proj``: gate, xBC and dt."""
        return self.intermediate_size + self.conv_dim + self.num_heads


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a causal LM, as the model layer needs it (a family may extend it with its own fields).

    Attributes:
        model_type: the ``model_type`` of ``config.json`` (the family's, `infinilm.models.registry`).
        qkv_bias / o_bias / mlp_bias: which projections carry a bias (Qwen2: q, k, v only).
        qk_norm: Qwen3's per-head RMSNorm of q and k over ``head_dim``, before RoPE.
        dtype: the checkpoint's dtype from the config (``torch_dtype``/``dtype``), float32 when absent.
        eos_token_ids: the ids that end a request.
        hf_config: the transformers config object (for RoPE variants computed by transformers).
        ssm: the Mamba-2 numbers of a recurrent model (its attention fields are then neutral), else None.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_type: str
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]
    hf_config: Any = field(repr=False, compare=False, default=None)
    ssm: Mamba2Dims | None = None

    @property
    def q_size(self) -> int:
        """Width of the query projection, ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (and the value) projection, ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    def ssm_dims(self) -> Mamba2Dims:
        """The recurrent numbers (`ssm`).

        Raises:
            ConfigError: the config has none (not a recurrent, Mamba-2 config).
        """
        if self.ssm is None:
            raise ConfigError(f"{self.model_type}: has no recurrent state (not a Mamba-2 config)")
        return self.ssm


def _integer(name: str, value: object) -> int:
    """`value` of option `name` as a Python int: an int or an integer scalar with ``__index__``.

    Raises:
        ConfigError: a bool, a float or anything else without ``__index__``.
    """
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)  # type: ignore[call-overload]
    except TypeError:
        raise ConfigError(f"{name}={value!r} must be an int, not a {type(value).__name__}") from None


def _sequence(name: str, value: object) -> tuple[object, ...]:
    """`value` of option `name` as a tuple: a tuple or a list (a str, iterable as it is, is refused).

    Raises:
        ConfigError: `value` is not a tuple or a list.
    """
    if not isinstance(value, tuple | list):
        raise ConfigError(f"{name}={value!r} must be a tuple (or a list), not a {type(value).__name__}")
    return tuple(value)


def _providers(value: object) -> tuple[tuple[str | None, str], ...]:
    """The ``providers`` option as a tuple of ``(op or None, provider name)`` pairs of non-empty strs.

    Raises:
        ConfigError: not a tuple or list of such pairs, naming the first entry that is not one.
    """
    pairs = _sequence("providers", value)
    for i, pair in enumerate(pairs):
        ok = isinstance(pair, tuple | list) and len(pair) == 2
        if ok:
            op, name = pair
            ok = (op is None or (isinstance(op, str) and op != "")) and isinstance(name, str) and name != ""
        if not ok:
            raise ConfigError(f"providers[{i}]={pair!r} must be a pair (operator name or None, provider name), "
                              "e.g. (\"gemm\", \"torch\") or (None, \"torch\")")
    return tuple((op, name) for op, name in pairs)  # type: ignore[misc]


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs a model.

    Attributes:
        device: ``cpu`` or ``cuda`` (``cuda:N``).
        dtype: compute and weight dtype, a `torch.dtype` or its name (``"bf16"``, stored as the dtype; see
            `parse_dtype`); None takes the checkpoint's.
        block_size: tokens per KV-cache block.
        num_blocks: KV-cache blocks per layer; None sizes the cache from `kv_cache_memory` (or, on CUDA, from
            `gpu_memory_utilization` of the free memory after the weights load). For a recurrent model
            (Mamba-2): state rows, one per running request (`infinilm.engine.state_pool`); None sizes them the same
            way, at most `max_num_seqs`.
        max_num_seqs: most sequences in one step.
        max_num_batched_tokens: most tokens (prefill + decode) in one step.
        max_model_len: longest sequence (prompt + output); None: the config's, capped at 8192.
        providers: ``(op or None, provider)`` overrides, applied as ``infiniops_py.use`` scopes.
        qk_norm: ``auto`` (one fused_qk_norm_rope with RoPE where a non-reference provider serves it, else
            fused_qk_norm where one serves that, else per-head rms_norm; RoPE then by rotary_embedding),
            ``fused`` (fused_qk_norm) or ``per_head``.
        add_norm: the projections into the residual stream (o, down; Mamba-2's out_proj) and the add + norm
            after them: ``separate`` (gemm, then fused_add_rms_norm: the faster on the H200, benchmarks/RESULTS.md
            session 10), ``fused`` (one gemm_add_rms_norm where a non-reference provider serves it, one
            process; one launch fewer per projection) or ``prologue`` (each norm folded into the prologue of the
            projection after it, one rms_norm_gemm: the qkv, the gate/up with SwiGLU and the LM head; o and down
            add into the residual stream as the Gemm's ``c``; where a non-reference provider serves them, one
            process, layers without a norm after each sub-block; two launches fewer per decoder layer than
            ``separate``, one per Mamba-2 layer, whose ``in_proj`` takes the block's norm and ``out_proj`` the ``c``).
        cuda_graphs: capture decode steps in CUDA graphs (CUDA only; falls back to eager when capture fails).
        prefill_graph_lengths: Mamba-2 only, CUDA only, with `cuda_graphs`: bucket lengths at which the prefill
            of a lone prompt (no other request in the step) is captured as a CUDA graph; a prompt is padded on
            the left to the smallest bucket that holds it; longer prompts and packed steps run eagerly
            (`infinilm.engine.graphs.prefill`). Each bucket must fit `max_num_batched_tokens`.
        kv_cache_memory: bytes for the KV cache when `num_blocks` is None and not on CUDA.
        gpu_memory_utilization: fraction of the device memory the engine may fill (weights + cache).
        progress: show a progress bar while loading; None: only for checkpoints over 1 GiB.
        check_indices: range-check the slot mappings, block tables and sequence lengths the engine hands to
            the operators (checked mode, each check synchronizes the device). None: on CPU only, since on
            CUDA the syncs cost more than the rest of a decode step, and the engine builds every index from
            its own allocator (kernels still never access out of bounds in unchecked mode).
        tensor_parallel_size: ranks the model is split across, one process each (`infinilm.distributed`):
            the engine's process is rank 0 and starts the others; 1 runs in this process alone.
        async_scheduling: schedule and launch step N+1 before reading step N's sampled ids, so the host's work
            overlaps the device's (vLLM V1's ``async_scheduling``; `infinilm.engine.overlap`). None: on CUDA
            with one rank, off on the CPU, where the device is the host and nothing overlaps. Refused with
            ``tensor_parallel_size > 1`` (the followers would need the ids on their own devices).
    """

    device: str = "cpu"
    dtype: torch.dtype | None = None
    block_size: int = 16
    num_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    providers: tuple[tuple[str | None, str], ...] = ()
    qk_norm: str = "auto"
    add_norm: str = "separate"
    cuda_graphs: bool = True
    prefill_graph_lengths: tuple[int, ...] = ()
    kv_cache_memory: int = 512 << 20
    gpu_memory_utilization: float = 0.9
    progress: bool | None = None
    check_indices: bool | None = None
    tensor_parallel_size: int = 1
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        """Check every option, and store each in its canonical form (dtype, ints, tuples).

        An int option takes an int or an integer scalar with ``__index__`` (a NumPy integer); a bool or a
        float (``16.0``) is refused, never truncated. A flag takes a bool only (``"no"`` would be true).

        Raises:
            ConfigError: an option of the wrong type or out of its range, naming the option and the value.
        """
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory", "tensor_parallel_size"):
            object.__setattr__(self, name, _integer(name, getattr(self, name)))
        for name in ("num_blocks", "max_model_len"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _integer(name, getattr(self, name)))
        for name, optional in (("cuda_graphs", False), ("progress", True), ("check_indices", True),
                               ("async_scheduling", True)):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (optional and value is None):
                raise ConfigError(f"{name}={value!r} must be True or False{' (or None)' if optional else ''}")
        lengths = _sequence("prefill_graph_lengths", self.prefill_graph_lengths)
        object.__setattr__(self, "prefill_graph_lengths",
                           tuple(_integer(f"prefill_graph_lengths[{i}]", n) for i, n in enumerate(lengths)))
        object.__setattr__(self, "providers", _providers(self.providers))
        if isinstance(self.gpu_memory_utilization, bool) or not isinstance(self.gpu_memory_utilization, Real):
            raise ConfigError(f"gpu_memory_utilization={self.gpu_memory_utilization!r} must be a number in (0, 1]")
        if self.dtype is not None:  # a name becomes its torch.dtype; an unsupported one is refused here
            object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        try:
            device_type = torch.device(self.device).type
        except (RuntimeError, TypeError):
            device_type = None
        if device_type not in ("cpu", "cuda"):
            raise ConfigError(f"device={self.device!r} is not a device the engine runs on; use cpu, cuda or cuda:N")
        if self.block_size <= 0:
            raise ConfigError(f"block_size={self.block_size} must be positive")
        if self.tensor_parallel_size <= 0:
            raise ConfigError(f"tensor_parallel_size={self.tensor_parallel_size} must be positive (1: no split)")
        if self.num_blocks is not None and self.num_blocks <= 0:
            raise ConfigError(f"num_blocks={self.num_blocks} must be positive")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ConfigError(f"max_model_len={self.max_model_len} must be positive (or None: the config's)")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ConfigError("max_num_seqs and max_num_batched_tokens must be positive")
        if self.qk_norm not in ("auto", "fused", "per_head"):
            raise ConfigError(f"qk_norm={self.qk_norm!r} must be one of auto, fused, per_head")
        if self.add_norm not in ("separate", "fused", "prologue"):
            raise ConfigError(f"add_norm={self.add_norm!r} must be one of separate, fused, prologue")
        if any(n <= 0 or n > self.max_num_batched_tokens for n in self.prefill_graph_lengths):
            raise ConfigError(f"prefill_graph_lengths={self.prefill_graph_lengths}: each must be in [1, "
                              f"max_num_batched_tokens={self.max_num_batched_tokens}]")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")
        if self.kv_cache_memory <= 0:
            raise ConfigError(f"kv_cache_memory={self.kv_cache_memory} must be a positive number of bytes")
        if self.async_scheduling and self.tensor_parallel_size > 1:
            raise ConfigError(f"async_scheduling=True with tensor_parallel_size={self.tensor_parallel_size}: "
                              "async scheduling runs on one rank only; leave it None (off) or False")

    def schedules_async(self, device: torch.device) -> bool:
        """Whether the engine overlaps steps on `device`: `async_scheduling`, else on CUDA with one rank."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        return device.type == "cuda" and self.tensor_parallel_size == 1

    def checks_indices(self, device: torch.device) -> bool:
        """Whether operator index checks run on `device`: `check_indices`, else on CPU only."""
        return self.check_indices if self.check_indices is not None else device.type == "cpu"

    def resolved_dtype(self, config: ModelConfig) -> torch.dtype:
        """The compute dtype: `dtype`, else the checkpoint's (``config.dtype``)."""
        return self.dtype if self.dtype is not None else config.dtype

    def model_len(self, config: ModelConfig) -> int:
        """The longest sequence: `max_model_len`, else the config's positions capped at 8192."""
        return self.max_model_len if self.max_model_len is not None else min(config.max_position_embeddings, 8192)

    def blocks_per_seq(self, config: ModelConfig) -> int:
        """KV-cache blocks one sequence of `model_len` tokens needs."""
        return math.ceil(self.model_len(config) / self.block_size)
