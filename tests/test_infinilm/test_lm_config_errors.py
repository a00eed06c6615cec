"""Bad checkpoint directories and options: one clear error (exit 2) naming the file or field, never a traceback.

The cases: config.json that is not JSON, a field of the wrong type, sizes and head counts that are zero or
negative (which must fail ``check`` too, not only ``generate`` when it allocates a negative dimension), and
nan/inf sampling parameters.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lm_helpers import hf_config

from infinilm import ConfigError, EngineOptions, SamplingParams, read_config
from infinilm.cli import main
from infinilm.models.registry import config_from_hf, model_types
from infinilm.serve.chat_template import load_chat_template

SMALL = ["--block-size", "16", "--num-blocks", "16", "--max-model-len", "64"]


def _dir(tmp_path: Path, name: str, config: dict[str, Any] | str) -> Path:
    """A checkpoint directory holding only config.json (a dict is written as JSON, a str verbatim)."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def _valid(family: str = "qwen3", **changes: Any) -> dict[str, Any]:
    return {**hf_config(family, tied=False).to_dict(), **changes}


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """(exit status, stderr) of the CLI run in-process; argparse errors exit through SystemExit."""
    try:
        status = main(list(argv))
    except SystemExit as stop:
        status = int(stop.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


def _check_and_generate(capsys: pytest.CaptureFixture[str], path: Path) -> list[str]:
    """Both commands exit 2; their stderr lines."""
    out = []
    for argv in (["check", "--model", str(path), *SMALL],
                 ["generate", "--model", str(path), "--prompt", "1,2", *SMALL]):
        status, err = _cli(capsys, *argv)
        assert status == 2, err
        assert err.startswith(f"infinilm {argv[0]}: error: ")
        out.append(err)
    return out


def test_config_json_that_is_not_json_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _dir(tmp_path, "badjson", "{bad")
    for err in _check_and_generate(capsys, path):
        assert f"{path / 'config.json'}: not valid JSON: Expecting property name" in err
        assert "line 1, column 2" in err
    path = _dir(tmp_path, "list", "[1, 2]")
    for err in _check_and_generate(capsys, path):
        assert f"{path / 'config.json'}: expected a JSON object, got a JSON list" in err
    path = tmp_path / "binary"
    path.mkdir()
    (path / "config.json").write_bytes(bytes([0xFF, 0xFE, 0x80]) + random.randbytes(16))
    for err in _check_and_generate(capsys, path):
        assert "not UTF-8 text" in err


def test_json_nested_too_deeply_to_parse_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """json's decoder recurses per nested array: config.json, the safetensors index or tokenizer_config.json
    nested 100000 deep ended in a RecursionError traceback (exit 1)."""
    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path = _dir(tmp_path, "deep-config", deep)
    for err in _check_and_generate(capsys, path):
        assert f"{path / 'config.json'}: nested too deeply to parse" in err, err
    path = _dir(tmp_path, "deep-index", {k: v for k, v in _valid().items() if v is not None})
    (path / "model.safetensors.index.json").write_text(deep)
    for err in _check_and_generate(capsys, path):
        assert f"{path / 'model.safetensors.index.json'}: nested too deeply to parse" in err, err
    (path / "tokenizer_config.json").write_text(deep)
    with pytest.raises(ConfigError, match=r"tokenizer_config\.json: not valid JSON \(maximum recursion depth"):
        load_chat_template(path)


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_a_config_dtype_that_is_no_supported_torch_dtype_name_is_named(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers turns the name into ``getattr(torch, name)``: "banana" (or "bf16") ended in its
    AttributeError traceback, exit 1."""
    for value in ("banana", "bf16", "float64", 5):
        path = _dir(tmp_path, f"{key}-{value}", {**_valid(), "dtype": None, key: value})
        for err in _check_and_generate(capsys, path):
            assert f"{path / 'config.json'}: the qwen3 model config has 1 problem(s)" in err, err
            assert f"{key}={value!r} is not supported; allowed: 'float32', 'bfloat16', 'float16'" in err, err
    assert read_config(_dir(tmp_path, f"{key}-half", {**_valid(), "dtype": None, key: "half"})).dtype is torch.float16


def test_a_model_path_that_is_a_file_or_missing_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "config.json"
    file.write_text(json.dumps(_valid()))
    assert "is a file (expected a Hugging Face checkpoint directory" in _check_and_generate(capsys, file)[0]
    assert "does not exist" in _check_and_generate(capsys, tmp_path / "nowhere")[0]


def test_a_missing_model_type_is_refused_with_the_fix(tmp_path: Path) -> None:
    supported = ", ".join(model_types())  # llama, qwen2, qwen3, mamba2, then the newer families
    assert supported.startswith("llama, qwen2, qwen3, mamba2")
    with pytest.raises(ConfigError, match=rf"no model_type \(fix: set it to one of {re.escape(supported)}\)"):
        read_config(_dir(tmp_path, "untyped", {"hidden_size": 64}))


def test_a_field_of_the_wrong_type_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _dir(tmp_path, "big", {"model_type": "qwen3", "hidden_size": "big"})
    for err in _check_and_generate(capsys, path):
        assert "the qwen3 model config has 1 problem(s)" in err
        assert "hidden_size='big' must be a positive integer" in err
    for bad in (True, 64.5):
        with pytest.raises(ConfigError, match=r"intermediate_size=.* must be a positive integer"):
            read_config(_dir(tmp_path, f"t{bad}", _valid(intermediate_size=bad)))
    # a field these checks leave to transformers: its strict validation, on one line, naming file and field
    with pytest.raises(ConfigError, match=r"config\.json: transformers rejects it: .*'tie_word_embeddings'") as info:
        read_config(_dir(tmp_path, "tie", _valid(tie_word_embeddings="yes")))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("field", ["rms_norm_eps", "rope_theta"])
def test_a_float_field_of_an_int_beyond_the_float_range_is_named(field: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # The hostile pass of issue #30: math.isfinite(10**400) raised OverflowError out of the config check, a
    # traceback from `infinilm check` instead of the field's name.
    path = _dir(tmp_path, "huge", _valid(**{field: 10**400}))
    for err in _check_and_generate(capsys, path):
        assert f"{field}=1000" in err and "must be" in err, err


def test_nonpositive_sizes_fail_check_and_generate_with_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hidden = -random.randint(1, 64)
    path = _dir(tmp_path, "neg", {"model_type": "qwen3", "hidden_size": hidden, "num_attention_heads": 0})
    for err in _check_and_generate(capsys, path):  # check used to exit 0 with 0/32 heads, gqa_ratio=0
        assert f"{path / 'config.json'}: the qwen3 model config has 2 problem(s)" in err
        assert f"hidden_size={hidden} must be a positive integer" in err
        assert "num_attention_heads=0 must be a positive integer" in err
        assert "gqa_ratio" not in err and "negative dimension" not in err
    config = _valid("llama", vocab_size=0, num_hidden_layers=0, intermediate_size=-3, rms_norm_eps=0.0,
                    max_position_embeddings=-1, num_key_value_heads=-2)
    with pytest.raises(ConfigError, match=r"the llama model config has 6 problem\(s\)") as info:
        read_config(_dir(tmp_path, "many", config))
    for field in ("vocab_size=0", "num_hidden_layers=0", "intermediate_size=-3", "rms_norm_eps=0.0",
                  "max_position_embeddings=-1", "num_key_value_heads=-2"):
        assert field in str(info.value)


def test_heads_that_do_not_divide_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="num_attention_heads=4 must be a multiple of num_key_value_heads=3"):
        read_config(_dir(tmp_path, "gqa", _valid(num_key_value_heads=3)))
    # Qwen2 has no head_dim: it is hidden_size / num_attention_heads, which must then be whole
    qwen2 = _valid("qwen2", hidden_size=66)
    qwen2.pop("head_dim", None)
    with pytest.raises(ConfigError, match="hidden_size=66 must be a multiple of num_attention_heads=4"):
        read_config(_dir(tmp_path, "qwen2", qwen2))
    # Qwen3 gives head_dim itself: hidden_size need not be num_attention_heads * head_dim
    assert read_config(_dir(tmp_path, "qwen3", _valid(hidden_size=66))).head_dim == 32


def _resolved(**changes: Any) -> SimpleNamespace:
    """A config object as transformers would resolve it (defaults filled in), without its own validation."""
    return SimpleNamespace(**{**_valid("qwen2"), "head_dim": None, "rope_parameters": None, **changes})


def test_resolved_values_are_checked_too() -> None:
    """Defaults transformers fills in, or a config object built in code, go through the same checks."""
    assert config_from_hf(_resolved()).head_dim == 16
    with pytest.raises(ConfigError, match=r"3 problem\(s\)") as info:
        config_from_hf(_resolved(num_attention_heads=0, rope_theta=float("nan"), num_hidden_layers=None))
    text = str(info.value)
    assert "num_attention_heads=0" in text and "rope_theta=nan must be a positive finite number" in text
    assert "num_hidden_layers is missing" in text
    with pytest.raises(ConfigError, match="num_attention_heads=4 must be a multiple of num_key_value_heads=8"):
        config_from_hf(_resolved(num_key_value_heads=8))


def test_mamba2_sizes_are_checked(tmp_path: Path) -> None:
    config = {"model_type": "mamba2", "num_heads": 0, "head_dim": -8, "state_size": 0, "vocab_size": 64}
    with pytest.raises(ConfigError, match=r"the mamba2 model config has 3 problem\(s\)") as info:
        read_config(_dir(tmp_path, "mamba2", config))
    assert "num_heads=0" in str(info.value) and "head_dim=-8" in str(info.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize("option", ["--temperature", "--top-p"])
def test_nonfinite_sampling_options_are_refused(value: str, option: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _dir(tmp_path, "m", _valid())  # refused by argparse, before the config is read
    status, err = _cli(capsys, "generate", "--model", str(path), "--prompt", "1,2", f"{option}={value}", *SMALL)
    assert status == 2
    assert f"argument {option}: {value!r} is not a finite number" in err


def test_sampling_params_refuse_nonfinite_values() -> None:
    temperature = random.uniform(0.1, 2.0)
    assert SamplingParams(temperature=temperature).temperature == temperature
    for bad in (float("nan"), float("inf"), -temperature):
        with pytest.raises(ValueError, match=r"temperature=.* must be a finite number >= 0"):
            SamplingParams(temperature=bad)
    with pytest.raises(ValueError, match="top_p=nan"):
        SamplingParams(top_p=float("nan"))


def test_sampling_options_are_checked_before_the_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _dir(tmp_path, "noweights", _valid())
    status, err = _cli(capsys, "generate", "--model", str(path), "--prompt", "1,2", "--max-new-tokens", "0", *SMALL)
    assert status == 2 and "max_new_tokens=0 must be >= 1" in err  # not the missing model.safetensors
    status, err = _cli(capsys, "generate", "--model", str(path), "--prompt", "1,2", "--max-model-len", "-5")
    assert status == 2 and "max_model_len=-5 must be positive" in err
    with pytest.raises(ConfigError, match="max_model_len=0"):
        EngineOptions(max_model_len=0)


def test_a_tokenizer_json_that_cannot_be_read_names_the_file(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _dir(tmp_path, "tok", _valid())
    (path / "tokenizer.json").write_text("{nope")
    status, err = _cli(capsys, "generate", "--model", str(path), "--prompt", "hello", *SMALL)
    assert status == 2 and f"{path / 'tokenizer.json'}: not a readable tokenizer" in err


def _with_config(src: Path, dst: Path, **changes: Any) -> Path:
    """A copy of checkpoint directory `src` (its weights) whose config.json has `changes`."""
    import shutil

    shutil.copytree(src, dst)
    (dst / "config.json").write_text(json.dumps({**json.loads((src / "config.json").read_text()), **changes}))
    return dst


@pytest.mark.parametrize("kind", ["yarn", "linear"])
def test_a_rope_factor_whose_scaled_length_overflows_a_float_is_not_a_traceback(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    """max_positions multiplied the positions by the factor as floats: a finite factor such as 1e308 gave inf,
    and int(inf) ended check and generate in an OverflowError traceback."""
    from transformers.utils import logging

    from infinilm.engine.checks import max_positions

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # transformers warns that the yarn factor is not 256 / 64 (to a stale stream)
    request.addfinalizer(lambda: logging.set_verbosity(verbosity))
    scaling = {"rope_type": kind, "factor": 1e308, **({"original_max_position_embeddings": 64} if kind == "yarn"
                                                      else {})}
    path = _dir(tmp_path, kind, {**_valid("llama"), "rope_scaling": scaling, "rope_parameters": None})
    assert max_positions(read_config(path)) == (64 if kind == "yarn" else 256) * int(1e308)
    for argv in (["check", "--model", str(path), *SMALL], ["generate", "--model", str(path), "--prompt", "1", *SMALL]):
        status, err = _cli(capsys, *argv)
        assert status == 2 and err.startswith(f"infinilm {argv[0]}: error: {path}: no model.safetensors"), err


@pytest.mark.parametrize(("family", "changes", "tensor"), [
    ("qwen3", {"hidden_size": 2**62}, f"the embedding and LM head [vocab_size x hidden_size = 256 x {2**62}]"),
    ("qwen3", {"intermediate_size": 2**62}, f"the gate/up projection [2 x intermediate_size x hidden_size = "
                                            f"{2**63} x 64]"),
    ("qwen3", {"num_attention_heads": 2**62}, "the q/k/v projection [(num_attention_heads + 2 x num_key_value_heads)"
                                              f" x head_dim x hidden_size = {(2**62 + 4) * 32} x 64]"),
    ("llama", {"vocab_size": 2**61}, f"the embedding and LM head [vocab_size x hidden_size = {2**61} x 64]"),
    ("mamba2", {"vocab_size": 2**62}, f"the embedding and LM head [vocab_size x hidden_size = {2**62} x 32]"),
])
def test_config_sizes_no_torch_tensor_can_hold_are_refused_naming_the_tensor(
    family: str, changes: dict[str, Any], tensor: str, checkpoint: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """Sizes past 2**61 passed the config checks and the gates, then building the model on the meta device (to
    compare the headers) ended in torch's RuntimeError "Storage size calculation overflowed" or TypeError
    "Overflow when unpacking long long": a traceback from check and generate."""
    path, _ = checkpoint(family)
    capsys.readouterr()  # (saving the checkpoint may show a progress bar)
    bad = _with_config(path, tmp_path / "bad", **changes)
    for err in _check_and_generate(capsys, bad):
        assert f"{bad / 'config.json'}: {tensor}" in err, err
        assert "more than a torch tensor holds (2**63 - 1 bytes)" in err, err


def test_a_max_model_len_whose_cache_cannot_hold_one_sequence_is_refused_before_the_weights(
    checkpoint: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the cache sized from memory (no num_blocks), a max_model_len the config allows (2**34 positions)
    passed check, and generate built the model, with its RoPE table of 2**34 rows (a 128 GiB allocation:
    torch's RuntimeError traceback, or the memory of a larger machine), before the cache was found to be too
    small for one sequence."""
    path, _ = checkpoint("llama")
    capsys.readouterr()
    big = _with_config(path, tmp_path / "big", max_position_embeddings=2**34)
    from infinilm import Engine

    built: list[object] = []
    monkeypatch.setattr(Engine, "_build", staticmethod(lambda *args: built.append(args)))  # no model is built
    for argv in (["check", "--model", str(big), "--max-model-len", str(2**34)],
                 ["generate", "--model", str(big), "--prompt", "1 2", "--max-model-len", str(2**34)]):
        status, err = _cli(capsys, *argv)
        assert status == 2, err
        assert f"cannot hold one sequence of max_model_len={2**34}" in err, err
    # the default budget (512 MiB) holds one sequence of the config's 8192 positions: the check passes
    from infinilm.engine.checks import check_options

    check_options(read_config(big), EngineOptions())
    with pytest.raises(ConfigError, match=f"cannot hold one sequence of max_model_len={2**20}"):
        check_options(read_config(big), EngineOptions(max_model_len=2**20, kv_cache_memory=2**20))
    assert not built


@pytest.mark.parametrize("kind", ["dangling-link", "directory", "fifo"])
def test_a_tokenizer_json_that_is_not_a_regular_file_is_named_not_taken_for_no_tokenizer(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tokenizer.json that exists but cannot be read as a file (a hub snapshot's link to a blob not downloaded, a
    directory, a FIFO) was taken for a checkpoint without a tokenizer: generate said "has no tokenizer.json" and
    the server served token ids only. A FIFO is never opened (reading it would wait for a writer)."""
    import os

    from infinilm.tokenizer import load_tokenizer

    path = _dir(tmp_path, kind, _valid())
    file = path / "tokenizer.json"
    what = {"dangling-link": "a link to a missing file", "directory": "a directory", "fifo": "a FIFO (named pipe)"}
    if kind == "dangling-link":
        file.symlink_to(tmp_path / "blobs" / "0123abcd")
    elif kind == "directory":
        file.mkdir()
    else:
        os.mkfifo(file)
    message = f"{file}: not a readable tokenizer: it is {what[kind]}"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_tokenizer(path)
    status, err = _cli(capsys, "generate", "--model", str(path), "--prompt", "hello", *SMALL)
    assert status == 2 and err == f"infinilm generate: error: {message}\n", err
    assert load_tokenizer(_dir(tmp_path, "none", _valid())) is None  # no tokenizer.json at all: ids only


@pytest.mark.parametrize(("family", "changes", "problem"), [
    ("qwen3", {"head_dim": 2**33}, f"head_dim={2**33} is out of range: need 2 <= head_dim <= 4096"),
    ("qwen3", {"head_dim": 2**62}, f"head_dim={2**62} is out of range: need 2 <= head_dim <= 4096"),
    ("llama", {"head_dim": 4098}, "head_dim=4098 is out of range: need 2 <= head_dim <= 4096"),
    ("qwen2", {"head_dim": None, "hidden_size": 2**35}, f"head_dim = hidden_size / num_attention_heads = {2**33} is "
                                                        "out of range: need head_dim <= 4096"),
    ("qwen3", {"num_hidden_layers": 20000}, "num_hidden_layers=20000 is out of range: need 1 <= num_hidden_layers "
                                            "<= 1024"),
    ("llama", {"num_hidden_layers": 10**6}, f"num_hidden_layers={10**6} is out of range"),
    ("mamba2", {"num_hidden_layers": 10**6}, f"num_hidden_layers={10**6} is out of range: need 1 <= "
                                             "num_hidden_layers <= 1024"),
])
def test_a_head_dim_or_layer_count_far_above_real_models_is_refused_before_any_tensor(
    family: str, changes: dict[str, Any], problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head_dim of 2**33 made reading the config compute its RoPE frequencies (a 34 GB CPU allocation; 2**62: a
    RuntimeError traceback); 20000 layers made check build and list 320,004 missing tensors (7 s; a million
    layers, minutes). Both are refused while the fields are checked, before any frequency is computed."""
    import infinilm.models.decoder_config as decoder_config

    computed: list[int] = []
    compute = decoder_config.inverse_frequencies
    monkeypatch.setattr(decoder_config, "inverse_frequencies",
                        lambda config, dim: computed.append(dim) or compute(config, dim))
    config = _valid(family, **changes)
    if config.get("head_dim", 0) is None:
        del config["head_dim"]
    config.pop("layer_types", None)  # transformers derives them from num_hidden_layers
    with pytest.raises(ConfigError, match=r"1 problem\(s\)") as info:
        read_config(_dir(tmp_path, "big", config))
    assert problem in str(info.value)
    assert "released models" in str(info.value)
    assert not computed
    # the bounds themselves are accepted
    widest = _valid("qwen3", head_dim=4096, num_hidden_layers=1024)
    widest.pop("layer_types", None)
    edge = read_config(_dir(tmp_path, "edge", widest))
    assert (edge.head_dim, edge.num_layers) == (4096, 1024) and computed == [4096]


def test_a_checkpoint_with_a_layer_count_far_above_real_models_is_refused_quickly(
    checkpoint: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check of a checkpoint whose config.json says 20000 layers (layer_types absent) listed one missing tensor per
    line of each layer it does not hold."""
    import time

    path, _ = checkpoint("qwen3")
    capsys.readouterr()
    config = {**json.loads((path / "config.json").read_text()), "num_hidden_layers": 20000}
    config.pop("layer_types", None)
    bad = _with_config(path, tmp_path / "bad")
    (bad / "config.json").write_text(json.dumps(config))
    start = time.monotonic()
    for err in _check_and_generate(capsys, bad):
        assert "num_hidden_layers=20000 is out of range: need 1 <= num_hidden_layers <= 1024" in err
        assert "missing" not in err and len(err.splitlines()) == 2
    assert time.monotonic() - start < 5
