"""Loading: single file and sharded checkpoints, dtype choice, and one error listing every mismatch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from lm_helpers import CheckpointFactory
from safetensors.torch import load_file, save_file

from infinilm import Engine, EngineOptions, LoadError
from infinilm.loader import checkpoint_files

PROMPT = [5, 80, 13, 200, 7, 7, 31]


def _copy_config(src: Path, dst: Path) -> None:
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")


def _options(**kw: object) -> EngineOptions:
    return EngineOptions(**{"block_size": 8, "num_blocks": 16, "max_model_len": 64, **kw})


def test_sharded_checkpoint_loads_and_matches(checkpoint: CheckpointFactory, tmp_path: Path) -> None:
    _, hf = checkpoint("qwen2")
    hf.save_pretrained(str(tmp_path), max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(checkpoint_files(tmp_path)) > 2
    engine = Engine.from_pretrained(tmp_path, _options(progress=True))
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(engine.prefill_logits([PROMPT])[0], ref, rtol=0, atol=1e-4)


def test_every_mismatch_is_listed_in_one_error(checkpoint: CheckpointFactory, tmp_path: Path) -> None:
    path, _ = checkpoint("qwen3")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    del tensors["model.layers.0.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.randn(8, 64)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.randn(16)  # ignored, not unexpected
    tensors["model.layers.9.mlp.gate_proj.weight"] = torch.randn(96, 64)
    _copy_config(path, tmp_path / "bad")
    save_file(tensors, str(tmp_path / "bad" / "model.safetensors"))
    with pytest.raises(LoadError) as info:
        Engine.from_pretrained(tmp_path / "bad", _options())
    text = str(info.value)
    assert "(4 problem(s))" in text
    assert "missing: model.layers.1.self_attn.k_norm.weight" in text
    assert "missing: model.layers.0.mlp.up_proj.weight" in text
    assert "mis-shaped: model.layers.0.self_attn.q_proj.weight: checkpoint [8, 64], model expects [128, 64]" in text
    assert "unexpected: model.layers.9.mlp.gate_proj.weight" in text


def test_missing_or_corrupt_files(checkpoint: CheckpointFactory, tmp_path: Path) -> None:
    path, _ = checkpoint("llama")
    _copy_config(path, tmp_path / "empty")
    with pytest.raises(LoadError, match=r"no model\.safetensors"):
        Engine.from_pretrained(tmp_path / "empty", _options())
    _copy_config(path, tmp_path / "corrupt")
    (tmp_path / "corrupt" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(LoadError, match="not a readable safetensors file"):
        Engine.from_pretrained(tmp_path / "corrupt", _options())
    _copy_config(path, tmp_path / "index")
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}
    (tmp_path / "index" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(LoadError, match="missing shard"):
        Engine.from_pretrained(tmp_path / "index", _options())


def test_dtype_comes_from_the_config_or_the_option(checkpoint: CheckpointFactory, tmp_path: Path) -> None:
    path, hf = checkpoint("llama", tied=True)
    assert Engine.from_pretrained(path, _options()).model.embed.weight.dtype == torch.float32
    engine = Engine.from_pretrained(path, _options(dtype=torch.bfloat16))
    assert engine.model.layers[0].qkv_proj.weight.dtype == torch.bfloat16
    assert engine.cache.keys[0].dtype == torch.bfloat16
    assert engine.model.lm_head.weight is engine.model.embed.weight  # tied
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0]
    logits = engine.prefill_logits([PROMPT])[0].float()
    assert (logits - ref).abs().max() < 0.05 * ref.abs().max()  # bf16 weights and activations, 2 layers
    config = json.loads((path / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (tmp_path / "bf16").mkdir()
    (tmp_path / "bf16" / "config.json").write_text(json.dumps(config))
    shutil.copy(path / "model.safetensors", tmp_path / "bf16" / "model.safetensors")
    assert Engine.from_pretrained(tmp_path / "bf16", _options()).model.embed.weight.dtype == torch.bfloat16
