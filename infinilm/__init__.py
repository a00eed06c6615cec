"""infinilm: Hugging Face checkpoints of the model families `infinilm.models.registry` lists (Llama-like
attention decoders and the recurrent Mamba-2) through `infiniops_py`, with a paged KV cache, or a recurrent
state pool for a recurrent model.

Every Gemm, Add, RmsNorm, FusedQkNorm, paged-cache write and attention (for Mamba-2: causal conv and
selective scan) of a model runs through the capability resolver; the operators a configuration needs are
gated (`infinilm.engine.gates`) before any weight is read. Entry points: `Engine.from_pretrained`,
`read_config`, `SamplingParams`, and the ``infinilm`` console script.
"""

from __future__ import annotations

from infinilm.config import ConfigError, EngineOptions, ModelConfig
from infinilm.engine import Engine, StepOutput
from infinilm.engine.loader import LoadError
from infinilm.engine.sequence import FinishReason, SamplingParams, Sequence
from infinilm.models.registry import read_config
from infiniops_py import __version__ as __version__  # infinilm ships in the infiniops-py distribution

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
    "read_config",
]
