"""Tiny Hugging Face models for the infinilm tests: GQA (4 query heads, 2 KV heads), 2 layers, hidden 64,
vocab 256, float32 on CPU, random weights from fixed seeds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "glm4", "gemma2")
SLIDING_WINDOW = 8  # Mistral's and Gemma 2's: shorter than most test prompts and than every prompt and continuation
# Gemma 2's softcaps, small enough for the random weights' scores (a few tenths) and logits to reach them
GEMMA2_SOFTCAPS: dict[str, object] = {"attn_logit_softcapping": 0.05, "final_logit_softcapping": 1.0}
# a tiny Mamba2Config: 4 heads x head_dim 16 = expand 2 x hidden 32, d_state 16, conv width 4, chunks of 8
MAMBA2_BASE: dict[str, object] = {
    "vocab_size": 160, "hidden_size": 32, "num_hidden_layers": 2, "state_size": 16, "expand": 2, "head_dim": 16,
    "num_heads": 4, "n_groups": 1, "conv_kernel": 4, "chunk_size": 8, "eos_token_id": 159, "pad_token_id": 0,
    "bos_token_id": 0,
}


def hf_config(family: str, *, tied: bool, **overrides: object) -> object:
    """A small transformers config of `family` (llama with attention and MLP biases, to cover them; mistral with
    a `SLIDING_WINDOW`; glm4 turning half of each head of 32; gemma2 with the window on its even layers and
    `GEMMA2_SOFTCAPS`; mamba2 from `MAMBA2_BASE`)."""
    from transformers import (
        Gemma2Config,
        Glm4Config,
        LlamaConfig,
        Mamba2Config,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
    )

    if family == "mamba2":
        return Mamba2Config(**{**MAMBA2_BASE, "tie_word_embeddings": tied, **overrides})
    common = {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tied, "eos_token_id": 255, "bos_token_id": 0,
    }
    common.update(overrides)
    if family == "llama":
        return LlamaConfig(**common, attention_bias=True, mlp_bias=True, rope_theta=10000.0)
    if family == "qwen2":
        return Qwen2Config(**common, rope_theta=1e6)
    if family == "gemma2":
        return Gemma2Config(**{"sliding_window": SLIDING_WINDOW, **GEMMA2_SOFTCAPS, "head_dim": 16,
                               "query_pre_attn_scalar": 16, "pad_token_id": 0, **common})
    if family == "glm4":
        return Glm4Config(**{"head_dim": 32, "partial_rotary_factor": 0.5, "attention_bias": True, "pad_token_id": 0,
                             **common})
    if family == "mistral":
        return MistralConfig(**{"sliding_window": SLIDING_WINDOW, **common}, rope_theta=1e4)
    return Qwen3Config(**common, head_dim=32, rope_theta=1e6)


def hf_model(family: str, *, tied: bool, seed: int = 0, **overrides: object) -> torch.nn.Module:
    """The transformers model of `hf_config`, random weights from `seed`, eval mode.

    Norm weights are drawn around 1 (HF initializes them to exactly 1), so that a norm applied with the
    wrong weight, or not at all, changes the logits.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    # Gemma 2's softcapping needs transformers' eager attention (some versions' SDPA path drops it silently)
    eager = {"attn_implementation": "eager"} if family == "gemma2" else {}
    model = AutoModelForCausalLM.from_config(hf_config(family, tied=tied, **overrides), **eager).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    return model


CheckpointFactory = Callable[..., tuple[Path, torch.nn.Module]]


class Replayer:
    """Stands in for a captured CUDA graph on CPU: replay reruns the same forward over the static buffers."""

    def __init__(self, steps: object, size: int) -> None:
        self.steps, self.size = steps, size
        self.out = steps._forward(size)  # type: ignore[attr-defined]
        self.replays = 0

    def replay(self) -> None:
        self.out.copy_(self.steps._forward(self.size))  # type: ignore[attr-defined]
        self.replays += 1

    def pool(self) -> None:
        return None


def replay_on_cpu(monkeypatch: pytest.MonkeyPatch, captured_steps: type) -> None:
    """Make `captured_steps` (a `infinilm.engine.graphs.capture.CapturedSteps` subclass) "capture" `Replayer`s, so its
    bucketing, padding and replay run on CPU."""
    def capture(self: object, size: int, pool: object) -> tuple[Replayer, torch.Tensor]:
        replayer = Replayer(self, size)
        return replayer, replayer.out

    monkeypatch.setattr(captured_steps, "_capture_one", capture)


def zeros_checkpoint(src: Path, dst: Path, **config_changes: object) -> Path:
    """A copy of checkpoint directory `src` (config.json, with `config_changes`, and one model.safetensors)
    whose tensors have the names, shapes and dtypes of `src`'s but are all zeros: valid headers, values that
    no test may depend on (``infinilm check`` reads the headers only)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensors[name] = torch.zeros_like(st.get_tensor(name))
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = {**json.loads((src / "config.json").read_text()), **config_changes}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def headers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``safetensors.safe_open`` give the names, shapes and dtypes of the tensors and nothing else: a
    test fails where any tensor data is read (``get_tensor``, or a slice read)."""
    import safetensors

    real = safetensors.safe_open

    class Header:
        def __init__(self, piece: Any) -> None:
            self.get_shape, self.get_dtype = piece.get_shape, piece.get_dtype

    class HeadersOnly:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.file = real(*args, **kwargs)

        def __enter__(self) -> HeadersOnly:
            self.st = self.file.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.__exit__(*exc)

        def keys(self) -> list[str]:
            return self.st.keys()

        def get_slice(self, name: str) -> Header:
            return Header(self.st.get_slice(name))

        def get_tensor(self, name: str) -> None:
            pytest.fail(f"tensor data was read: {name}")

    monkeypatch.setattr(safetensors, "safe_open", HeadersOnly)
