"""infinilm: Llama, Qwen2 and Qwen3 Hugging Face checkpoints through `infiniops_py`, with a paged KV cache,
and Mamba-2 with a recurrent state pool.

Every Gemm, Add, RmsNorm, FusedQkNorm, paged-cache write and attention (for Mamba-2: causal conv and
selective scan) of the model runs through the capability resolver; the operators a configuration needs
are gated (`infinilm.engine.gates`) before any weight is read. Entry points: `Engine.from_pretrained`,
`SamplingParams`, and the ``infinilm`` console script.
"""

from __future__ import annotations

from infinilm.config import ConfigError, EngineOptions, ModelConfig
from infinilm.engine import Engine, StepOutput
from infinilm.engine.loader import LoadError
from infinilm.engine.sequence import FinishReason, SamplingParams, Sequence

__all__ = [
    "ConfigError",
    "Engine",
    "EngineOptions",
    "FinishReason",
    "LoadError",
    "ModelConfig",
    "SamplingParams",
    "Sequence",
    "StepOutput",
]
