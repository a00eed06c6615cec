"""Config reading: the three families as data, RoPE variants, and clear errors for what cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lm_helpers import CheckpointFactory, hf_config

from infinilm import ConfigError, Engine, EngineOptions, ModelConfig
from infinilm.config import parse_dtype


def test_families_differ_as_data() -> None:
    llama = ModelConfig.from_hf(hf_config("llama", tied=False))
    qwen2 = ModelConfig.from_hf(hf_config("qwen2", tied=True))
    qwen3 = ModelConfig.from_hf(hf_config("qwen3", tied=False))
    assert (llama.qkv_bias, llama.o_bias, llama.mlp_bias, llama.qk_norm) == (True, True, True, False)
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.mlp_bias, qwen2.qk_norm) == (True, False, False, False)
    assert (qwen3.qkv_bias, qwen3.o_bias, qwen3.mlp_bias, qwen3.qk_norm) == (False, False, False, True)
    assert qwen2.tie_word_embeddings and not qwen3.tie_word_embeddings
    assert (qwen3.head_dim, qwen2.head_dim, qwen3.num_kv_heads) == (32, 16, 2)
    assert (qwen3.rope_theta, qwen3.eos_token_ids) == (1e6, (255,))


def test_llama3_rope_scaling_matches_transformers(checkpoint: CheckpointFactory) -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    path, hf = checkpoint("llama", rope_scaling=scaling)
    assert ModelConfig.from_pretrained(path).rope_type == "llama3"
    engine = Engine.from_pretrained(path, EngineOptions(block_size=8, num_blocks=16, max_model_len=128))
    prompt = list(range(3, 100))
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(engine.prefill_logits([prompt])[0], ref, rtol=0, atol=1e-4)


def _write(tmp_path: Path, config: dict[str, object]) -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_unsupported_configs_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no config\.json"):
        ModelConfig.from_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="model_type='gpt2' is not supported; supported: llama, qwen2, qwen3"):
        ModelConfig.from_pretrained(_write(tmp_path / "gpt2", {"model_type": "gpt2"}))
    qwen2 = hf_config("qwen2", tied=False).to_dict()
    with pytest.raises(ConfigError, match="use_sliding_window"):
        ModelConfig.from_pretrained(_write(tmp_path / "sw", {**qwen2, "use_sliding_window": True}))
    dynamic = {**hf_config("llama", tied=False).to_dict(), "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    dynamic.pop("rope_parameters", None)
    with pytest.raises(ConfigError, match="rope_type='dynamic'"):
        ModelConfig.from_pretrained(_write(tmp_path / "dyn", dynamic))


def test_options_are_checked() -> None:
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype(torch.float16) is torch.float16
    with pytest.raises(ConfigError, match="float64"):
        parse_dtype("float64")
    with pytest.raises(ConfigError, match="block_size"):
        EngineOptions(block_size=0)
    with pytest.raises(ConfigError, match="qk_norm"):
        EngineOptions(qk_norm="sometimes")


def test_a_cache_too_small_for_one_sequence_is_refused(checkpoint: CheckpointFactory) -> None:
    path, _ = checkpoint("qwen3")
    with pytest.raises(ConfigError, match="cannot hold one sequence"):
        Engine.from_pretrained(path, EngineOptions(block_size=8, num_blocks=3, max_model_len=64))
