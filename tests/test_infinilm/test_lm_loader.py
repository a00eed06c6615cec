"""Loading: single file and sharded checkpoints (also as the hub cache lays them out), dtype choice, one error
listing every mismatch, and bad checkpoints refused from their headers before the model is allocated."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from lm_helpers import CheckpointFactory
from safetensors.torch import load_file, save_file

from infinilm import Engine, EngineOptions, LoadError
from infinilm.engine.loader import checkpoint_files

PROMPT = [5, 80, 13, 200, 7, 7, 31]


def _copy_config(src: Path, dst: Path) -> None:
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")


def _options(**kw: object) -> EngineOptions:
    return EngineOptions(**{"block_size": 8, "num_blocks": 16, "max_model_len": 64, **kw})


def _hub_snapshot(src: Path, repo: Path) -> Path:
    """`src` laid out as the Hugging Face hub cache does: ``snapshots/<rev>/<file>`` links to ``blobs/<name>``."""
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in src.iterdir():
        shutil.copy(f, repo / "blobs" / f.name)
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", f.name))
    return snapshot


def test_sharded_checkpoint_loads_and_matches(checkpoint: CheckpointFactory, tmp_path: Path) -> None:
    _, hf = checkpoint("qwen2")
    sharded = tmp_path / "sharded"
    hf.save_pretrained(str(sharded), max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(checkpoint_files(sharded)) > 2
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0]
    # as saved, and as the hub cache keeps it (every file a symlink out of the snapshot, into ../../blobs)
    for path in (sharded, _hub_snapshot(sharded, tmp_path / "models--tiny--qwen2")):
        engine = Engine.from_pretrained(path, _options(progress=True))
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


def _write_sharded(dst: Path, config: Path, shards: dict[str, dict[str, torch.Tensor]],
                   index: dict[str, object] | str | None = None) -> Path:
    """A checkpoint directory: config.json, each shard saved by safetensors, and an index (a dict is written as
    JSON, a str verbatim; None maps each tensor to the shard that holds it)."""
    _copy_config(config, dst)
    for name, tensors in shards.items():
        save_file(tensors, str(dst / name))
    if index is None:
        index = {name: shard for shard, tensors in shards.items() for name in tensors}
    text = index if isinstance(index, str) else json.dumps({"metadata": {}, "weight_map": index})
    (dst / "model.safetensors.index.json").write_text(text)
    return dst


def _bad_checkpoint(case: str, src: Path, root: Path) -> Path:
    """The checkpoint directory of one refused case, built from the tensors of the good checkpoint `src`."""
    tensors = load_file(str(src / "model.safetensors"))
    first = {n: t for n, t in tensors.items() if n.startswith("model.layers.0.")}  # a sharding into two files
    second = {n: t for n, t in tensors.items() if n not in first}
    other = root / "other"  # a complete checkpoint of the same model, outside the directory
    _copy_config(src, other)
    shutil.copy(src / "model.safetensors", other / "model.safetensors")
    dst = root / case
    if case == "dotdot":
        return _write_sharded(dst, src, {}, dict.fromkeys(tensors, "../other/model.safetensors"))
    if case == "absolute":
        return _write_sharded(dst, src, {}, dict.fromkeys(tensors, str(other / "model.safetensors")))
    if case == "symlink":
        _write_sharded(dst, src, {}, dict.fromkeys(tensors, "model-00001-of-00001.safetensors"))
        (dst / "model-00001-of-00001.safetensors").symlink_to(other / "model.safetensors")
        return dst
    if case == "not-a-str":
        return _write_sharded(dst, src, {"a.safetensors": tensors}, {**dict.fromkeys(tensors, "a.safetensors"),
                                                                     "model.norm.weight": 7})
    if case == "listed-twice":
        pairs = [f'"{name}": "a.safetensors"' for name in tensors] + ['"model.norm.weight": "b.safetensors"']
        index = '{"metadata": {}, "weight_map": {' + ", ".join(pairs) + "}}"
        shards = {"a.safetensors": tensors, "b.safetensors": {"model.norm.weight": torch.ones(64)}}
        return _write_sharded(dst, src, shards, index)
    if case == "in-two-shards":
        second["model.norm.weight"] = torch.zeros(64)  # also in the first shard, whose copy the index names
        index = {**dict.fromkeys(first, "a.safetensors"), **dict.fromkeys(second, "b.safetensors"),
                 "model.norm.weight": "a.safetensors"}
        first["model.norm.weight"] = tensors["model.norm.weight"]
        return _write_sharded(dst, src, {"a.safetensors": first, "b.safetensors": second}, index)
    if case == "not-floating-point":
        tensors["model.norm.weight"] = torch.ones(64, dtype=torch.int64)
        tensors["model.layers.0.input_layernorm.weight"] = torch.ones(64, dtype=torch.bool)
        tensors["model.layers.1.input_layernorm.weight"] = torch.ones(64, dtype=torch.complex64)
        return _write_sharded(dst, src, {"a.safetensors": tensors})
    if case == "header-lies-about-sizes":  # the header's offsets reach past the end of the (truncated) file
        _write_sharded(dst, src, {"a.safetensors": first, "b.safetensors": second})
        data = (dst / "b.safetensors").read_bytes()
        (dst / "b.safetensors").write_bytes(data[:-4])
        return dst
    if case == "not-in-the-index":  # b.safetensors holds model.norm.weight, which the index leaves out
        index = {**dict.fromkeys(first, "a.safetensors"), **dict.fromkeys(second, "b.safetensors")}
        del index["model.norm.weight"]
        return _write_sharded(dst, src, {"a.safetensors": first, "b.safetensors": second}, index)
    if case == "missing-shard":
        return _write_sharded(dst, src, {"a.safetensors": first}, {**dict.fromkeys(first, "a.safetensors"),
                                                                   **dict.fromkeys(second, "b.safetensors")})
    if case == "index-outside":  # the index itself a link to an index outside (its shards inside)
        (other / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(tensors,
                                                                                                  "a.safetensors")}))
        _write_sharded(dst, src, {"a.safetensors": tensors})
        (dst / "model.safetensors.index.json").unlink()
        (dst / "model.safetensors.index.json").symlink_to(other / "model.safetensors.index.json")
        return dst
    if case == "shard-symlink-loop":
        _write_sharded(dst, src, {"a.safetensors": first}, {**dict.fromkeys(first, "a.safetensors"),
                                                           **dict.fromkeys(second, "b.safetensors")})
        (dst / "b.safetensors").symlink_to("b.safetensors")
        return dst
    if case in ("shard-directory", "shard-fifo"):
        _write_sharded(dst, src, {"a.safetensors": first}, {**dict.fromkeys(first, "a.safetensors"),
                                                           **dict.fromkeys(second, "b.safetensors")})
        (dst / "b.safetensors").mkdir() if case == "shard-directory" else os.mkfifo(dst / "b.safetensors")
        return dst
    if case in ("index-directory", "single-fifo"):  # an index that is a directory is not skipped for the file
        _copy_config(src, dst)
        if case == "index-directory":
            (dst / "model.safetensors.index.json").mkdir()
            save_file(tensors, str(dst / "model.safetensors"))
        else:
            os.mkfifo(dst / "model.safetensors")
        return dst
    assert case == "mis-shaped", case  # a checkpoint of another size than the config says
    second["model.layers.1.mlp.down_proj.weight"] = torch.randn(64, 80)
    return _write_sharded(dst, src, {"a.safetensors": first, "b.safetensors": second})


BAD_CHECKPOINTS = {  # case -> what the error says
    "dotdot": [r"weight_map\['model\.norm\.weight'\]='\.\./other/model\.safetensors' must be a file name "
               r"relative to the checkpoint directory \(no absolute path, no '\.\.'\)"],
    "absolute": [r"weight_map\['model\.norm\.weight'\]='/.*/other/model\.safetensors' must be a file name relative"],
    "symlink": [r"index\.json: shard\(s\) outside the checkpoint directory \(symlinks are followed\)",
                r"model-00001-of-00001\.safetensors resolves to .*/other/model\.safetensors, outside .*/symlink"],
    "not-a-str": [r"weight_map\['model\.norm\.weight'\]=7 must be a str \(a shard file name\)"],
    "listed-twice": [r"weight_map lists 'model\.norm\.weight' more than once \(a tensor must come from one shard\)"],
    "in-two-shards": [r"model\.norm\.weight is in two shards: a\.safetensors and b\.safetensors"],
    "not-floating-point": [r"\(3 problem\(s\)\)",
                           r"not floating point: model\.norm\.weight: dtype I64 in a\.safetensors \(the model loads "
                           r"torch\.float32 weights; allowed checkpoint dtypes: F64, F32, F16, BF16",
                           r"model\.layers\.0\.input_layernorm\.weight: dtype BOOL",
                           r"model\.layers\.1\.input_layernorm\.weight: dtype C64"],
    "header-lies-about-sizes": [r"b\.safetensors: not a readable safetensors file \(SafetensorError: .*incomplete "
                                r"metadata, file not fully covered"],
    "not-in-the-index": [r"model\.norm\.weight is in b\.safetensors, which the index does not map it to \(the "
                         r"index must list every tensor of its shards\)"],
    "missing-shard": [r"index\.json names missing shard\(s\): .*/b\.safetensors"],
    "mis-shaped": [r"mis-shaped: model\.layers\.1\.mlp\.down_proj\.weight: checkpoint \[64, 80\], model expects "
                   r"\[64, 96\]"],
    # each of these was read (the index outside), reported as a missing file, silently skipped (an index that is a
    # directory, for model.safetensors), or ended in pathlib's RuntimeError traceback (a symlink loop)
    "index-outside": [r"index-outside: the index outside the checkpoint directory \(symlinks are followed\)",
                      r"index-outside/model\.safetensors\.index\.json resolves to .*/other/model\.safetensors\.index"
                      r"\.json, outside"],
    "shard-symlink-loop": [r"index\.json: shard\(s\) are not regular files", r"b\.safetensors is a symlink loop"],
    "shard-directory": [r"index\.json: shard\(s\) are not regular files", r"b\.safetensors is a directory"],
    "shard-fifo": [r"index\.json: shard\(s\) are not regular files", r"b\.safetensors is a FIFO \(named pipe\)"],
    "index-directory": [r"index-directory: the index is not a regular file",
                        r"model\.safetensors\.index\.json is a directory"],
    "single-fifo": [r"single-fifo: shard\(s\) are not regular files", r"model\.safetensors is a FIFO"],
}


@pytest.mark.parametrize("case", list(BAD_CHECKPOINTS))
def test_a_bad_checkpoint_is_refused_from_its_headers_before_the_model_is_allocated(
        case: str, checkpoint: CheckpointFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards (or the index) outside the directory (``..``, absolute, a symlink out), shards (or an index) that
    are not regular files (a directory, a FIFO, which is never opened, a symlink loop), a weight_map value that is
    not a str, a
    tensor listed twice or held by two shards, a tensor of a shard the index does not list, integer/bool/complex
    weights, a header whose offsets do not cover
    its file, a missing shard and a tensor of another shape: each is one LoadError naming the file and tensor,
    raised before any tensor is allocated on the device (only meta tensors are built) or read."""
    path, _ = checkpoint("qwen2")
    bad = _bad_checkpoint(case, path, tmp_path)
    built: list[str] = []
    build = Engine._build

    def spy(*args: object) -> object:
        model = build(*args)  # type: ignore[arg-type]
        built.append(model.embed.weight.device.type)
        return model

    monkeypatch.setattr(Engine, "_build", staticmethod(spy))
    with pytest.raises(LoadError) as info:
        Engine.from_pretrained(bad, _options())
    for pattern in BAD_CHECKPOINTS[case]:
        assert re.search(pattern, str(info.value)), (pattern, str(info.value))
    assert str(bad) in str(info.value)
    assert "cpu" not in built, "the model was allocated before the checkpoint was refused"


def test_a_checkpoint_with_many_mismatches_lists_the_first_20_of_each_kind(checkpoint: CheckpointFactory) -> None:
    """The error listed every mismatch, one line each: a config.json of 20000 layers against a checkpoint of two
    gave 320,004 lines (and took seconds to build)."""
    from infinilm.engine.loader import read_checkpoint

    path, _ = checkpoint("qwen3")
    ckpt = read_checkpoint(path)
    real = dict(ckpt.headers)
    targets = {n: torch.empty(h.shape, device="meta") for n, h in real.items() if "layers.0." not in n}
    unexpected = len(real) - len(targets)  # layer 0's tensors: fewer than 20, all listed
    assert 0 < unexpected <= 20
    targets |= {f"model.layers.{i}.mlp.up_proj.weight": torch.empty(96, 64, device="meta") for i in range(2, 5000)}
    name = "model.embed_tokens.weight"
    targets[name] = torch.empty(3, 3, device="meta")
    with pytest.raises(LoadError) as info:
        ckpt.check(targets)
    lines = str(info.value).splitlines()
    assert lines[0] == f"{path}: the checkpoint does not fit the model ({4998 + unexpected + 1} problem(s)):"
    assert lines[1:21] == [f"  missing: model.layers.{i}.mlp.up_proj.weight (expected shape [96, 64])"
                           for i in range(2, 22)]
    assert lines[21] == "  ... and 4978 more missing"
    assert [line.split(":")[0] for line in lines[22:]] == ["  unexpected"] * unexpected + ["  mis-shaped"]
    assert f"mis-shaped: {name}: checkpoint {list(real[name].shape)}, model expects [3, 3]" in lines[-1]
