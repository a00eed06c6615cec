"""Model families: Llama, Qwen2 and Qwen3 share one implementation (`LlamaModel`), differing as data."""

from __future__ import annotations

from infinilm.models.llama import LlamaModel

__all__ = ["LlamaModel"]
