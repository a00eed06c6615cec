"""Config reading: the three families as data, RoPE variants, and clear errors for what cannot run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lm_helpers import CheckpointFactory, hf_config

from infinilm import ConfigError, Engine, EngineOptions, read_config
from infinilm.cli import main
from infinilm.config import parse_dtype
from infinilm.models.registry import config_from_hf


def test_families_differ_as_data() -> None:
    llama = config_from_hf(hf_config("llama", tied=False))
    qwen2 = config_from_hf(hf_config("qwen2", tied=True))
    qwen3 = config_from_hf(hf_config("qwen3", tied=False))
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
    assert read_config(path).rope_type == "llama3"
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
        read_config(tmp_path)
    with pytest.raises(ConfigError, match="model_type='gpt2' is not supported; supported: llama, qwen2, qwen3"):
        read_config(_write(tmp_path / "gpt2", {"model_type": "gpt2"}))
    qwen2 = hf_config("qwen2", tied=False).to_dict()
    with pytest.raises(ConfigError, match="use_sliding_window"):
        read_config(_write(tmp_path / "sw", {**qwen2, "use_sliding_window": True}))
    dynamic = {**hf_config("llama", tied=False).to_dict(), "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    dynamic.pop("rope_parameters", None)
    with pytest.raises(ConfigError, match="rope_type='dynamic'"):
        read_config(_write(tmp_path / "dyn", dynamic))


def test_options_are_checked() -> None:
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype(torch.float16) is torch.float16
    with pytest.raises(ConfigError, match="float64"):
        parse_dtype("float64")
    with pytest.raises(ConfigError, match="block_size"):
        EngineOptions(block_size=0)
    with pytest.raises(ConfigError, match="qk_norm"):
        EngineOptions(qk_norm="sometimes")


@pytest.mark.parametrize(("option", "value", "message"), [
    ("cuda_graphs", "no", "cuda_graphs='no' must be True or False"),  # a truthy str turned graphs on
    ("cuda_graphs", None, "cuda_graphs=None must be True or False"),
    ("progress", "x", "progress='x' must be True or False (or None)"),
    ("check_indices", 1, "check_indices=1 must be True or False (or None)"),
    ("block_size", 16.0, "block_size=16.0 must be an int, not a float"),
    ("num_blocks", True, "num_blocks=True must be an int, not a bool"),
    ("max_num_seqs", 2.5, "max_num_seqs=2.5 must be an int, not a float"),
    ("max_num_batched_tokens", "64", "max_num_batched_tokens='64' must be an int, not a str"),
    ("max_model_len", 64.0, "max_model_len=64.0 must be an int, not a float"),
    ("kv_cache_memory", 1.5, "kv_cache_memory=1.5 must be an int, not a float"),
    ("kv_cache_memory", 0, "kv_cache_memory=0 must be a positive number of bytes"),
    ("gpu_memory_utilization", "0.5", "gpu_memory_utilization='0.5' must be a number in (0, 1]"),
    ("prefill_graph_lengths", "16", "prefill_graph_lengths='16' must be a tuple (or a list), not a str"),
    ("prefill_graph_lengths", (16.0,), "prefill_graph_lengths[0]=16.0 must be an int, not a float"),
    ("providers", "torch", "providers='torch' must be a tuple (or a list), not a str"),
    ("providers", (("gemm", 5),), "providers[0]=('gemm', 5) must be a pair (operator name or None, provider name)"),
])
def test_engine_options_of_the_wrong_type_are_refused_naming_the_option(option: str, value: object,
                                                                        message: str) -> None:
    """Flags took any truthy value and int options any number (a float block size, a bool cache size)."""
    with pytest.raises(ConfigError) as err:
        EngineOptions(**{option: value})
    assert str(err.value).startswith(message), err.value
    canonical = EngineOptions(block_size=np.int64(8), num_blocks=np.int32(4), prefill_graph_lengths=[16],
                              providers=[["gemm", "torch"]])  # integer scalars and lists are taken, as ints/tuples
    assert canonical.block_size == 8 and type(canonical.block_size) is int and type(canonical.num_blocks) is int
    assert canonical.prefill_graph_lengths == (16,) and canonical.providers == (("gemm", "torch"),)


def test_a_cache_too_small_for_one_sequence_is_refused(checkpoint: CheckpointFactory) -> None:
    path, _ = checkpoint("qwen3")
    with pytest.raises(ConfigError, match="cannot hold one sequence"):
        Engine.from_pretrained(path, EngineOptions(block_size=8, num_blocks=3, max_model_len=64))


def _rope(scaling: dict[str, object], **changes: object) -> dict[str, object]:
    """Config changes that set ``rope_scaling`` (config.json's spelling; transformers 5 reads it as well)."""
    return {"rope_scaling": scaling, "rope_parameters": None, **changes}


# (family, config.json changes, the problem line or its parts); every one used to pass `infinilm check` and fail,
# or run on garbage, after the weights had loaded
LIMITS_IN_CONFIG_JSON = {
    "conv-kernel-1": ("mamba2", {"conv_kernel": 1},
                      "conv_kernel=1 is out of range: need 2 <= conv_kernel <= 16 (the widths of the causal_conv1d"),
    "conv-kernel-17": ("mamba2", {"conv_kernel": 17}, "conv_kernel=17 is out of range: need 2 <= conv_kernel <= 16"),
    "mamba2-eos": ("mamba2", {"eos_token_id": 160}, "eos_token_id=160 must be token ids in [0, vocab_size=160)"),
    "llama-eos": ("llama", {"eos_token_id": [255, -1]},
                  "eos_token_id=[255, -1] must be token ids in [0, vocab_size=256)"),
    "activation": ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu' is not supported; allowed: 'silu'"),
    "odd-head-dim": ("qwen3", {"head_dim": 3}, "head_dim=3 must be even (rotate-half RoPE pairs dim i with dim i + "),
    "odd-derived-head-dim": ("qwen2", {"hidden_size": 60, "head_dim": None},
                             "head_dim = hidden_size / num_attention_heads = 15 must be even"),
    "partial-rotary": ("llama", {"partial_rotary_factor": 0.5},
                       "partial_rotary_factor=0.5 is not supported: llama rotates the whole head_dim"),
    "rope-factor": ("llama", _rope({"rope_type": "linear", "factor": 0}),
                    "rope_scaling.factor=0 must be a finite number >= 1 (linear RoPE)"),
    "llama3-band": ("llama", _rope({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
                    "rope_scaling.high_freq_factor=4.0 must be greater than low_freq_factor=4.0 (llama3 RoPE)"),
    "yarn-betas": ("qwen2", _rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                   "beta_fast": 1, "beta_slow": 8}),
                   "rope_scaling.beta_fast=1 must be >= beta_slow=8 (yarn RoPE"),
    "yarn-frequencies": ("qwen2", _rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
                                        rope_theta=1.0),
                         ("the yarn RoPE parameters {", "'rope_theta': 1.0", "the frequencies cannot be computed")),
}
# (family, resolved values, the problem line): what transformers 5 refuses itself in config.json, and what a
# config object built in code, or an older transformers, hands over as it is
LIMITS_OF_RESOLVED_VALUES = {
    "tie-word-embeddings": ("qwen2", {"tie_word_embeddings": "false"}, "tie_word_embeddings='false' must be true or"),
    "conv-bias": ("mamba2", {"use_conv_bias": "no"}, "use_conv_bias='no' must be true or false"),
    "time-step-limit": ("mamba2", {"time_step_limit": 5}, "time_step_limit=5 must be a (low, high) pair of numbers"),
}


@pytest.mark.parametrize("case", [*LIMITS_IN_CONFIG_JSON, *LIMITS_OF_RESOLVED_VALUES])
def test_a_config_outside_the_model_limits_is_refused_before_any_weight(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each limit of a model (the operator contracts' widths, the SiLU it implements, RoPE's even head dim and
    its parameters, boolean flags, EOS ids in the vocabulary) is checked with the config: `infinilm check` on a
    directory without weights exits 2 with the field, the value and what is allowed."""
    if case in LIMITS_OF_RESOLVED_VALUES:
        family, changes, problem = LIMITS_OF_RESOLVED_VALUES[case]
        resolved = SimpleNamespace(**{**hf_config(family, tied=False).to_dict(), **changes})
        with pytest.raises(ConfigError) as info:
            config_from_hf(resolved)
        assert problem in str(info.value)
        return
    family, changes, problem = LIMITS_IN_CONFIG_JSON[case]
    config = {k: v for k, v in {**hf_config(family, tied=False).to_dict(), **changes}.items() if v is not None}
    path = _write(tmp_path / case, config)
    assert main(["check", "--model", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"infinilm check: error: {path / 'config.json'}: " in err, err  # (transformers may log a warning too)
    for part in (problem,) if isinstance(problem, str) else problem:
        assert part in err, err
