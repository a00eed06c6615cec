"""Model families: Llama, Qwen2 and Qwen3 share one implementation (`LlamaModel`), differing as data;
Mamba-2 (`Mamba2Model`) is recurrent, with its state in `infinilm.engine.state_pool`."""

from __future__ import annotations

from infinilm.models.llama import LlamaModel
from infinilm.models.mamba2 import Mamba2Model

__all__ = ["LlamaModel", "Mamba2Model"]
