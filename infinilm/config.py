"""Model and engine configuration: what the model layer reads from ``config.json`` and the engine options.

`ModelConfig.from_pretrained` reads ``config.json`` through transformers' `AutoConfig` (LlamaConfig,
Qwen2Config, Qwen3Config) and keeps the few numbers the model needs; the differences between the three
families are data here (`qkv_bias`, `o_bias`, `mlp_bias`, `qk_norm`), not code paths. Reading a config
never touches the weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch

from infinilm.config_checks import (
    BOOLS,
    ConfigError,
    field_problems,
    hf_error_reason,
    raise_problems,
    read_config_json,
    resolved_problems,
    rope_problems,
)

if TYPE_CHECKING:
    from infinilm.models.mamba2 import Mamba2Dims

__all__ = ["SUPPORTED_MODEL_TYPES", "ConfigError", "EngineOptions", "ModelConfig", "parse_dtype"]

SUPPORTED_MODEL_TYPES: Final = ("llama", "qwen2", "qwen3", "mamba2")
_STATIC_ROPE_TYPES: Final = ("default", "linear", "llama3", "yarn")
_DTYPES: Final[dict[str, torch.dtype]] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """``"bf16"``, ``"bfloat16"``, ``torch.bfloat16`` -> ``torch.bfloat16``.

    Raises:
        ConfigError: not one of float32, bfloat16, float16.
    """
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise ConfigError(f"dtype {value!r} is not supported; use one of float32, bfloat16, float16")
    return _DTYPES[name]


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only Llama-family model, as the model layer needs it.

    Attributes:
        model_type: ``llama``, ``qwen2`` or ``qwen3``.
        qkv_bias / o_bias / mlp_bias: which projections carry a bias (Qwen2: q, k, v only).
        qk_norm: Qwen3's per-head RMSNorm of q and k over ``head_dim``, before RoPE.
        dtype: the checkpoint's dtype from the config (``torch_dtype``/``dtype``), float32 when absent.
        hf_config: the transformers config object (for RoPE variants computed by transformers).
        ssm: the Mamba-2 numbers of a recurrent model (``model_type="mamba2"``, built by
            `infinilm.models.mamba2.mamba2_config`; its attention fields are neutral), else None.
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

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``<path>/config.json`` (nothing else); every error names the file.

        The raw JSON is checked first (`infinilm.config_checks`), then read through transformers, then the
        resolved numbers (defaults filled in) are checked again by `from_hf`.

        Raises:
            ConfigError: no config.json; a file that is not a JSON object; a missing or unsupported
                ``model_type``; non-positive sizes or head counts, heads that do not divide (all listed in
                one error); a value transformers rejects; an unsupported RoPE type or sliding window.
        """
        from huggingface_hub.errors import StrictDataclassError
        from transformers import AutoConfig

        path = Path(path)
        file = path / "config.json"
        if not path.is_dir():
            what = "is a file" if path.exists() else "does not exist"
            raise ConfigError(f"{path} {what} (expected a Hugging Face checkpoint directory holding config.json)")
        if not file.is_file():
            raise ConfigError(f"{path}: no config.json (expected a Hugging Face checkpoint directory)")
        raw = read_config_json(file)
        mt = raw.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"{file}: {_unsupported(mt)}")
        raise_problems(mt, field_problems(mt, raw), file)
        try:
            hf = AutoConfig.from_pretrained(str(path))
        except (StrictDataclassError, ValueError, TypeError, KeyError, ArithmeticError) as err:
            raise ConfigError(f"{file}: transformers rejects it: {hf_error_reason(err)}") from None
        try:
            return cls.from_hf(hf)
        except ConfigError as err:
            raise ConfigError(f"{file}: {err}") from None

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        """Build from a transformers config object (LlamaConfig, Qwen2Config or Qwen3Config).

        Raises:
            ConfigError: an unsupported model type, RoPE type or sliding window; non-positive sizes, head
                counts, epsilon or RoPE theta, a head layout that does not divide, an odd head_dim, an
                activation other than SiLU, a flag that is not a boolean, an EOS id outside the vocabulary
                (all listed in one error); RoPE parameters out of their limits or from which the frequencies
                cannot be computed (`infinilm.config_checks.rope_problems`).
        """
        mt = getattr(hf, "model_type", "?")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(_unsupported(mt))
        if mt == "mamba2":
            from infinilm.models.mamba2 import mamba2_config

            return mamba2_config(hf)
        rope = _rope_parameters(hf)
        theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        heads, kv_heads, head_dim = _head_layout(mt, hf, theta)
        if getattr(hf, "use_sliding_window", False):
            raise ConfigError(f"{mt}: use_sliding_window=True is not supported (fix: set it to false)")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in _STATIC_ROPE_TYPES:
            raise ConfigError(f"{mt}: rope_type={rope_type!r} is not supported; supported: {_STATIC_ROPE_TYPES}")
        partial = getattr(hf, "partial_rotary_factor", None)
        raise_problems(mt, rope_problems(mt, rope_type, {"partial_rotary_factor": partial, **rope}))
        attention_bias = bool(getattr(hf, "attention_bias", False))
        dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None)
        config = cls(
            model_type=mt,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf.rms_norm_eps),
            rope_type=rope_type,
            rope_theta=float(theta),
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=True if mt == "qwen2" else attention_bias,
            o_bias=False if mt == "qwen2" else attention_bias,
            mlp_bias=mt == "llama" and bool(getattr(hf, "mlp_bias", False)),
            qk_norm=mt == "qwen3",
            dtype=parse_dtype(dtype) if dtype is not None else torch.float32,
            eos_token_ids=_ids(getattr(hf, "eos_token_id", None)),
            hf_config=hf,
        )
        _check_frequencies(config, rope)
        return config

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _unsupported(model_type: object) -> str:
    if model_type is None:
        return f"no model_type (fix: set it to one of {', '.join(SUPPORTED_MODEL_TYPES)})"
    return f"model_type={model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"


def _head_layout(mt: str, hf: Any, rope_theta: object) -> tuple[int, int, int]:
    """``(num_heads, num_kv_heads, head_dim)`` of an attention config, after checking every size it reads.

    A config without ``head_dim`` (Qwen2) takes ``hidden_size / num_attention_heads``, which must then divide
    and be even. The activation, the flags and the EOS ids are checked here too, so that one error lists
    every problem.

    Raises:
        ConfigError: every problem at once (see `infinilm.config_checks.field_problems` and
            `infinilm.config_checks.resolved_problems`).
    """
    heads = hf.num_attention_heads
    kv_heads = getattr(hf, "num_key_value_heads", None)
    kv_heads = heads if kv_heads is None else kv_heads
    head_dim = getattr(hf, "head_dim", None)
    values = {k: getattr(hf, k, None) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                "num_hidden_layers", "max_position_embeddings", "rms_norm_eps")}
    values |= {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
               "rope_theta": rope_theta}
    problems = [f"{k} is missing" for k, v in values.items() if v is None and k != "head_dim"]
    others = {k: getattr(hf, k, None) for k in ("hidden_act", "eos_token_id", *BOOLS[mt])}
    problems += field_problems(mt, values | others) + resolved_problems(mt, values | others)
    if head_dim is None and not problems and values["hidden_size"] % heads:
        problems.append(f"hidden_size={values['hidden_size']} must be a multiple of num_attention_heads={heads} "
                        f"(without head_dim, {mt} takes head_dim = hidden_size / num_attention_heads)")
    elif head_dim is None and not problems and (values["hidden_size"] // heads) % 2:
        problems.append(f"head_dim = hidden_size / num_attention_heads = {values['hidden_size'] // heads} must be "
                        "even (rotate-half RoPE pairs dim i with dim i + head_dim/2)")
    raise_problems(mt, problems)
    return heads, kv_heads, head_dim if head_dim is not None else values["hidden_size"] // heads


def _check_frequencies(config: ModelConfig, rope: dict[str, Any]) -> None:
    """Compute the RoPE frequencies now (what the model will build), so that they cannot fail after the gates.

    Raises:
        ConfigError: transformers cannot compute them from `rope`, or they are not ``head_dim / 2`` finite
            numbers with a finite positive attention scaling.
    """
    from infinilm.layers.rotary import inverse_frequencies

    what = f"{config.model_type}: the {config.rope_type} RoPE parameters {rope}"
    try:
        inv, scaling = inverse_frequencies(config)
    except (ArithmeticError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"{what}: the frequencies cannot be computed ({type(err).__name__}: "
                          f"{hf_error_reason(err)})") from None
    if tuple(inv.shape) != (config.head_dim // 2,) or not bool(inv.isfinite().all()):
        raise ConfigError(f"{what} give {list(inv.shape)} frequencies ({inv.isfinite().sum()} finite); need "
                          f"head_dim/2 = {config.head_dim // 2} finite ones")
    if not (math.isfinite(scaling) and scaling > 0):
        raise ConfigError(f"{what} give an attention scaling of {scaling}; need a positive finite number")


def _rope_parameters(hf: Any) -> dict[str, Any]:
    # transformers 5 normalizes RoPE settings into `rope_parameters`; 4.x keeps rope_theta + rope_scaling.
    params = getattr(hf, "rope_parameters", None)
    if params:
        return dict(params)
    return {"rope_theta": getattr(hf, "rope_theta", 10000.0), **(getattr(hf, "rope_scaling", None) or {})}


def _ids(value: int | Sequence[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


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
        qk_norm: ``auto`` (fused where a non-reference provider serves fused_qk_norm), ``fused`` or ``per_head``.
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
    cuda_graphs: bool = True
    prefill_graph_lengths: tuple[int, ...] = ()
    kv_cache_memory: int = 512 << 20
    gpu_memory_utilization: float = 0.9
    progress: bool | None = None
    check_indices: bool | None = None

    def __post_init__(self) -> None:
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
        if self.num_blocks is not None and self.num_blocks <= 0:
            raise ConfigError(f"num_blocks={self.num_blocks} must be positive")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ConfigError(f"max_model_len={self.max_model_len} must be positive (or None: the config's)")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ConfigError("max_num_seqs and max_num_batched_tokens must be positive")
        if self.qk_norm not in ("auto", "fused", "per_head"):
            raise ConfigError(f"qk_norm={self.qk_norm!r} must be one of auto, fused, per_head")
        if any(n <= 0 or n > self.max_num_batched_tokens for n in self.prefill_graph_lengths):
            raise ConfigError(f"prefill_graph_lengths={self.prefill_graph_lengths}: each must be in [1, "
                              f"max_num_batched_tokens={self.max_num_batched_tokens}]")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")

    def checks_indices(self, device: torch.device) -> bool:
        return self.check_indices if self.check_indices is not None else device.type == "cpu"

    def resolved_dtype(self, config: ModelConfig) -> torch.dtype:
        return self.dtype if self.dtype is not None else config.dtype

    def model_len(self, config: ModelConfig) -> int:
        return self.max_model_len if self.max_model_len is not None else min(config.max_position_embeddings, 8192)

    def blocks_per_seq(self, config: ModelConfig) -> int:
        return math.ceil(self.model_len(config) / self.block_size)
