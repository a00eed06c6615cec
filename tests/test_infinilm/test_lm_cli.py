"""The ``infinilm`` CLI: check, generate, bench, demo, and gates that fail before any weight is read."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import cpu_capability, registered
from infiniops_torch.flash_attn import flash_attn_varlen as torch_flash_attn_varlen
from infiniops_torch.flash_attn import flash_attn_with_kvcache as torch_flash_attn_with_kvcache
from lm_helpers import CheckpointFactory, headers_only, zeros_checkpoint

from infinilm import ConfigError, Engine, EngineOptions, SamplingParams
from infinilm.cli import main
from infinilm.demo import PROMPT, TEXT
from infinilm.tokenizer import load_tokenizer
from infiniops_py import OneOf, providers

SMALL = ["--block-size", "16", "--num-blocks", "16", "--max-model-len", "64"]


def _corrupt_copy(src: Path, dst: Path, **config_changes: object) -> Path:
    """A checkpoint directory whose config is readable and whose weights file is garbage."""
    dst.mkdir()
    config = {**json.loads((src / "config.json").read_text()), **config_changes}
    (dst / "config.json").write_text(json.dumps(config))
    (dst / "model.safetensors").write_bytes(b"\xff" * 64)
    return dst


def _run(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process, without inherited provider settings (no Triton interpreter on CPU)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFINIOPS_", "TRITON_"))} | extra_env
    return subprocess.run([sys.executable, "-m", "infinilm.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_check_lists_the_closure_and_reads_no_weights(checkpoint: CheckpointFactory, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = checkpoint("qwen2")
    zeros = zeros_checkpoint(path, tmp_path / "zeros")
    headers_only(monkeypatch)  # reading any tensor's data fails the test
    assert main(["check", "--model", str(zeros), *SMALL]) == 0
    out = capsys.readouterr().out
    for op in ("gemm", "rms_norm", "fused_add_rms_norm", "reshape_and_cache_flash", "flash_attn_varlen",
               "flash_attn_with_kvcache"):
        assert f"\n{op} " in out
    assert "torch." in out and "linear bias: fused into gemm" in out
    assert "the 27 tensor headers of 1 safetensors file(s) fit the model" in out


def test_a_provider_forced_onto_a_device_it_does_not_serve_fails_the_gates(
    checkpoint: CheckpointFactory, tmp_path: Path
) -> None:
    path, _ = checkpoint("qwen3")
    bad = _corrupt_copy(path, tmp_path / "bad")
    forced = ["--device", "cpu", "--provider", "flash_attn_varlen=triton", *SMALL]
    result = _run("check", "--model", str(bad), *forced)
    assert result.returncode == 1, result.stderr
    assert "gate check failed" in result.stderr
    assert "no provider can serve flash_attn_varlen" in result.stderr
    assert "triton (triton.flash_attn_varlen" in result.stderr and "device_type=cpu not in {cuda}" in result.stderr
    result = _run("generate", "--model", str(bad), "--prompt", "1 2 3", *forced)
    assert result.returncode == 1 and "gate check failed" in result.stderr  # gates ran before the bad weights


def test_a_head_dim_no_allowed_provider_serves_fails_the_gates(checkpoint: CheckpointFactory, tmp_path: Path) -> None:
    path, _ = checkpoint("qwen3")
    bad = _corrupt_copy(path, tmp_path / "bad", head_dim=48)
    # the Triton interpreter switch makes Triton declare cpu too, so that head_dim is its only objection
    result = _run("check", "--model", str(bad), "--device", "cpu", "--provider", "flash_attn_varlen=triton",
                  "--provider", "flash_attn_with_kvcache=triton", *SMALL, TRITON_INTERPRET="1",
                  INFINIOPS_TRITON_INTERPRET_CPU="1")
    assert result.returncode == 1, result.stderr
    assert "2 operator problem(s) of this configuration have no provider" in result.stderr
    assert "no provider can serve flash_attn_with_kvcache" in result.stderr
    assert "head_dim=48 not in" in result.stderr and "device_type=cpu not in" not in result.stderr


# family -> (the attention features its test checkpoint needs, the config.json changes that drop them)
ATTENTION_FEATURES = {"mistral": (("local",), {"sliding_window": None}),
                      "gemma2": (("local", "softcap"), {"sliding_window": None, "attn_logit_softcapping": None})}


@pytest.mark.parametrize("family", ATTENTION_FEATURES)
def test_an_attention_feature_no_allowed_provider_serves_fails_the_gates(
    family: str, checkpoint: CheckpointFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The only attention provider allowed serves no sliding window (local attention) and no logit softcap:
    a config that needs them is refused by the gates, naming the feature, before its garbage weights are
    read; the same config without them passes."""
    features, without = ATTENTION_FEATURES[family]
    path, _ = checkpoint(family)
    plain = cpu_capability(*(OneOf(f, (False,)) for f in ("local", "softcap")))
    forced = ["--provider", "flash_attn_varlen=plain", "--provider", "flash_attn_with_kvcache=plain", *SMALL]
    with registered(("plain", [("flash_attn_varlen", plain, 1, torch_flash_attn_varlen),
                               ("flash_attn_with_kvcache", plain, 1, torch_flash_attn_with_kvcache)])):
        assert main(["check", "--model", str(_corrupt_copy(path, tmp_path / "needs")), *forced]) == 1
        err = capsys.readouterr().err
        assert "gate check failed" in err and "no provider can serve flash_attn_varlen" in err, err
        for feature in features:  # the problem asks for it, the reason names what the provider allows
            assert f"{feature}=True" in err and f"{feature}=False" in err, err
        bad = _corrupt_copy(path, tmp_path / "gen")
        assert main(["generate", "--model", str(bad), "--prompt", "1 2", *forced]) == 1
        assert "not a readable safetensors file" not in capsys.readouterr().err  # the weights were never read
        assert main(["check", "--model", str(zeros_checkpoint(path, tmp_path / "plain", **without)), *forced]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\nflash_attn_varlen +plain\.", out) and "local=True" not in out, out


def test_generate_streams_token_ids_without_a_tokenizer(checkpoint: CheckpointFactory,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = checkpoint("llama")
    assert main(["generate", "--model", str(path), "--prompt", "4, 8, 15, 16", "--max-new-tokens", "6",
                 "--ignore-eos", *SMALL]) == 0
    out = capsys.readouterr().out.splitlines()
    engine = Engine.from_pretrained(path, EngineOptions(block_size=16, num_blocks=16, max_model_len=64))
    expected = engine.generate([[4, 8, 15, 16]], SamplingParams(max_new_tokens=6, ignore_eos=True))[0]
    assert [int(t) for t in out[0].split()] == expected
    assert out[1].startswith("[4 prompt tokens, 6 generated (length)") and "flash_attn_varlen=torch" in out[1]


def test_bench_prints_a_table(checkpoint: CheckpointFactory, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = checkpoint("qwen3")
    assert main(["bench", "--model", str(path), "--batch", "3", "--input-len", "8", "--output-len", "5",
                 *SMALL]) == 0
    out = capsys.readouterr().out
    assert "batch / input / output" in out and "3 / 8 / 5" in out and "decode throughput (tok/s)" in out
    # 18: a greedy step takes the argmax without the sampling operator (vLLM's all-greedy path); eight calls a
    # layer (the o and down projections then the add and the next norm, separate by default), the first norm and
    # the LM head; 14 with --add-norm fused (each projection with the add and the norm in one call)
    assert "one decode step of 3: 18 operator calls on the host (9.0 per layer), no device kernels" in out
    assert main(["bench", "--model", str(path), "--batch", "3", "--input-len", "8", "--output-len", "5",
                 "--add-norm", "fused", *SMALL]) == 0
    assert "one decode step of 3: 14 operator calls on the host (7.0 per layer), no device kernels" in (
        capsys.readouterr().out)
    # 13 with --add-norm prologue: six calls a layer (each norm in the next projection's rms_norm_gemm, o and down
    # adding the residual as the Gemm's c) and the LM head with the final norm
    assert main(["bench", "--model", str(path), "--batch", "3", "--input-len", "8", "--output-len", "5",
                 "--add-norm", "prologue", *SMALL]) == 0
    assert "one decode step of 3: 13 operator calls on the host (6.5 per layer), no device kernels" in (
        capsys.readouterr().out)


def test_bad_arguments_exit_2(checkpoint: CheckpointFactory, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = checkpoint("llama")
    assert main(["check", "--model", str(path), "--provider", "=triton"]) == 2
    assert main(["generate", "--model", str(path), "--prompt", "hello", *SMALL]) == 2
    assert "has no tokenizer.json" in capsys.readouterr().err
    assert main(["bench", "--model", str(path), "--prefill-graph-lengths", "16", *SMALL]) == 2
    assert "prefill graphs serve recurrent (Mamba-2) models only, not llama" in capsys.readouterr().err


def test_a_provider_override_naming_no_known_provider_or_operator_exits_2_naming_the_known_ones(
    checkpoint: CheckpointFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--provider gemm=nobody`` (a typo) exited 1 with a gate report of every problem, as if the
    configuration could not run; it is an argument error. The Python API's providers option is checked too."""
    path, _ = checkpoint("llama")
    capsys.readouterr()  # (saving the checkpoint may show a progress bar)
    known = ", ".join(sorted(p.name for p in providers() if p.loaded))
    for item, problem in (("gemm=nobody", f"no provider is named 'nobody' (known: {known})"),
                          ("nobody", f"no provider is named 'nobody' (known: {known})"),
                          ("notanop=torch", "unknown operator 'notanop' (known: gemm, add, rms_norm")):
        for argv in (["check", "--model", str(path)], ["generate", "--model", str(path), "--prompt", "1 2"]):
            err = _exit_2(capsys, *argv, "--provider", "gemm=torch", "--provider", item, *SMALL)
            assert f"--provider {item!r}: {problem}" in err, err
    with pytest.raises(ConfigError, match=rf"^providers\[1\]=\('gemm', 'nobody'\): no provider is named 'nobody' "
                                          rf"\(known: {known}\)$"):
        Engine.from_pretrained(path, EngineOptions(providers=((None, "torch"), ("gemm", "nobody"))))


def _exit_2(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The stderr of a CLI run that must exit 2 with one error line (no traceback)."""
    status = main(list(argv))
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith(f"infinilm {argv[0]}: error: ") and "Traceback" not in err
    return err


def test_bad_options_exit_2_naming_the_option_before_any_weight_is_read(
    checkpoint: CheckpointFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each of these used to end in a traceback (exit 1, the status of a gate rejection), or in a wrong message."""
    path, _ = checkpoint("llama")
    bad = _corrupt_copy(path, tmp_path / "bad")  # unreadable weights: every refusal below must come first
    gen = ["generate", "--model", str(bad), "--prompt", "1 2"]
    for device in ("banana", ""):
        for argv in ([*gen, *SMALL], ["check", "--model", str(bad), *SMALL]):
            err = _exit_2(capsys, *argv, "--device", device)
            assert f"device={device!r} is not a device the engine runs on; use cpu, cuda or cuda:N" in err
    for command in (gen, ["check", "--model", str(bad)]):
        err = _exit_2(capsys, *command, "--num-blocks", "1000000000")
        assert "num_blocks=1000000000: the KV cache (1000000000 x 8192 bytes) needs 8192000000000 bytes" in err
    err = _exit_2(capsys, *gen, "--max-model-len", "1000000000")
    assert "max_model_len=1000000000 exceeds the 256 positions this llama model serves" in err
    err = _exit_2(capsys, *gen, "--temperature", "1", "--seed", str(2**64), *SMALL)
    assert "seed=18446744073709551616 must be in [0, 2**64)" in err
    err = _exit_2(capsys, "bench", "--model", str(bad), "--seed", str(2**64), *SMALL)
    assert "seed=18446744073709551616 must be in [0, 2**64)" in err
    err = _exit_2(capsys, "generate", "--model", str(bad), "--prompt", "1 999999", *SMALL)
    assert "--prompt: token id(s) [999999] outside the vocabulary [0, 256)" in err
    err = _exit_2(capsys, "generate", "--model", str(tmp_path / "nonexistent"), "--prompt", "hello")
    assert f"{tmp_path / 'nonexistent'} does not exist" in err and "tokenizer" not in err
    with pytest.raises(ConfigError, match="does not exist"):  # not a checkpoint that has no tokenizer.json
        load_tokenizer(tmp_path / "nonexistent")


def test_a_checkpoint_index_without_a_weight_map_or_a_vast_vocab_exits_2_naming_the_file(
    checkpoint: CheckpointFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loader's KeyError/TypeError on such an index, and torch's allocation of a 2**40-row embedding,
    used to end in tracebacks: the CLI reports the loader's and the config's errors with exit 2."""
    path, _ = checkpoint("llama")
    for name, index in (("no-weight-map", {"metadata": {}}), ("list", [1, 2])):
        bad = tmp_path / name
        bad.mkdir()
        shutil.copy(path / "config.json", bad)
        (bad / "model.safetensors.index.json").write_text(json.dumps(index))
        err = _exit_2(capsys, "generate", "--model", str(bad), "--prompt", "1 2", *SMALL)
        assert f"{bad / 'model.safetensors.index.json'}: " in err and "weight_map" in err
    vast = tmp_path / "vast"
    shutil.copytree(path, vast)
    (vast / "config.json").write_text(json.dumps({**json.loads((path / "config.json").read_text()),
                                                  "vocab_size": 2**40}))
    err = _exit_2(capsys, "generate", "--model", str(vast), "--prompt", "1 2", *SMALL)
    assert str(vast) in err and str(2**40) in err


def test_check_refuses_every_checkpoint_generate_refuses_with_the_same_error(
    checkpoint: CheckpointFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``check`` read config.json only, so it passed (exit 0) checkpoints whose index named shards outside the
    directory, garbage weights and configs the weights do not fit; it now reads the index and the tensor
    headers as ``generate`` does before allocating, and fails with generate's error, naming the file."""
    path, _ = checkpoint("llama")
    assert main(["check", "--model", str(path), *SMALL]) == 0  # the same options pass the good checkpoint
    capsys.readouterr()
    cases: dict[str, tuple[Path, str]] = {}
    cases["garbage"] = (_corrupt_copy(path, tmp_path / "garbage"), "model.safetensors: not a readable safetensors")
    for name, shard in (("parent", "../../other/model.safetensors"), ("absolute", "/etc/passwd"), ("empty", ""),
                        ("int", 7), ("url", "file:///etc/passwd")):
        bad = tmp_path / name
        bad.mkdir()
        shutil.copy(path / "config.json", bad)
        (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": shard}}))
        cases[name] = (bad, "model.safetensors.index.json")
    vast = tmp_path / "vast"
    shutil.copytree(path, vast)
    (vast / "config.json").write_text(json.dumps({**json.loads((path / "config.json").read_text()),
                                                  "vocab_size": 2**40}))
    cases["vast"] = (vast, f"mis-shaped: model.embed_tokens.weight: checkpoint [256, 64], model expects [{2**40}, 64]")
    for name, (bad, message) in cases.items():
        checked = _exit_2(capsys, "check", "--model", str(bad), *SMALL)
        generated = _exit_2(capsys, "generate", "--model", str(bad), "--prompt", "1 2", *SMALL)
        assert str(bad) in checked and message in checked, (name, checked)
        assert checked.removeprefix("infinilm check: ") == generated.removeprefix("infinilm generate: "), name


def test_a_demo_cache_dir_that_cannot_hold_the_checkpoint_exits_2_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """INFINILM_CACHE pointing at a file used to end in FileExistsError."""
    for cache in (tmp_path / "a-file", tmp_path / "a-file" / "below"):
        (tmp_path / "a-file").write_text("not a directory")
        monkeypatch.setenv("INFINILM_CACHE", str(cache))
        err = _exit_2(capsys, "demo", "--max-new-tokens", "2")
        assert (f"{cache} ($INFINILM_CACHE): cannot hold the demo checkpoint: a file, not a directory, is in its "
                "path; point INFINILM_CACHE at a writable directory") in err


def test_demo_builds_once_and_generates_the_sentence_it_was_taught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INFINILM_CACHE", str(tmp_path))
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert TEXT.removeprefix(PROMPT) in out and "generated (eos)" in out
    (built,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert main(["demo", "--max-new-tokens", "8"]) == 0
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    shutil.rmtree(built)
