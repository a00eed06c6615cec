"""Mamba-2 through infinilm against transformers' ``Mamba2ForCausalLM`` (float32, CPU, tiny random models).

Prefill logits and every decode step's logits must equal transformers' forward within 1e-4, and greedy
tokens its ``generate``. With ``n_groups > 1`` the reference's gated norm is replaced by the per-group norm
written here (mamba_ssm's semantics), so the test does not depend on which form the installed transformers
uses. Also: the gates of a recurrent model, and ``infinilm check``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from fakes import cpu_capability, registered
from lm_helpers import MAMBA2_BASE, headers_only, zeros_checkpoint

from infinilm import ConfigError, Engine, EngineOptions, SamplingParams, read_config
from infinilm.cli import main
from infinilm.engine.gates import plan
from infiniops_py import GateError, OneOf
from infiniops_py.operators.rms_norm_gated import reference as gated_norm_reference

BASE = MAMBA2_BASE
ATOL = 1e-4


def hf_mamba2(seed: int = 0, **overrides: object) -> torch.nn.Module:
    """A tiny ``Mamba2ForCausalLM`` with random weights; norms, biases and D drawn so that each one matters."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(seed)
    model = Mamba2ForCausalLM(Mamba2Config(**{**BASE, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm_f.weight", ".D")):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias") and not name.endswith("dt_bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.generation_config.eos_token_id = None  # generate all the steps asked for
    return model


Factory = Callable[..., tuple[Path, torch.nn.Module]]


@pytest.fixture(scope="module")
def mamba2(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    """``mamba2(**config overrides)`` -> (checkpoint directory saved by transformers, the HF model), cached."""
    made: dict[str, tuple[Path, torch.nn.Module]] = {}

    def make(**overrides: object) -> tuple[Path, torch.nn.Module]:
        key = repr(sorted(overrides.items()))
        if key not in made:
            model = hf_mamba2(**overrides)
            path = tmp_path_factory.mktemp("mamba2")
            model.save_pretrained(str(path))
            made[key] = (path, model)
        return made[key]

    return make


def prompts(lengths: tuple[int, ...] = (13, 3, 1, 21), seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, BASE["vocab_size"] - 1, (n,), generator=gen).tolist() for n in lengths]


def hf_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def hf_greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def generate_recording(engine: Engine, batch: list[list[int]],
                       steps: int) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """Greedy outputs of `batch`, run together, and the logits each request saw at each of its steps."""
    seqs = [engine.add_request(p, SamplingParams(max_new_tokens=steps, ignore_eos=True)) for p in batch]
    seen: dict[int, list[torch.Tensor]] = {s.id: [] for s in seqs}
    run = engine.runner.run

    def recording(b: object) -> torch.Tensor:
        logits = run(b)
        for seq, row in zip(b.seqs, logits):  # type: ignore[attr-defined]
            seen[seq.id].append(row.clone())
        return logits

    engine.runner.run = recording  # type: ignore[method-assign]
    try:
        for _ in engine.stream():
            pass
    finally:
        del engine.runner.run
    return [s.output for s in seqs], [seen[s.id] for s in seqs]


def gated_norm(groups: int | None) -> Callable[..., torch.Tensor]:
    """A ``MambaRMSNormGated.forward``: mamba_ssm's ``RMSNormGated(norm_before_gate=False)``, normalizing
    ``y * silu(gate)`` per group, in float32; ``groups=None``: the older transformers slow path, one norm over
    the whole inner dim whatever ``n_groups``."""

    def forward(self: torch.nn.Module, hidden_states: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        dtype = hidden_states.dtype
        y = hidden_states.float() * torch.nn.functional.silu(gate.float())
        y = y.unflatten(-1, (groups or 1, -1))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * y.flatten(-2).to(dtype)

    return forward


VARIANTS = {
    "untied": {},
    "tied": {"tie_word_embeddings": True},
    "biases-residual-in-model-dtype": {"use_bias": True, "use_conv_bias": False, "residual_in_fp32": False},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_match_transformers(mamba2: Factory, variant: str) -> None:
    path, hf = mamba2(**VARIANTS[variant])
    engine = Engine.from_pretrained(path, EngineOptions(num_blocks=4))
    batch = prompts()
    for prompt, logits in zip(batch, engine.prefill_logits(batch)):  # one packed prefill of four prompts
        torch.testing.assert_close(logits, hf_logits(hf, prompt), rtol=0, atol=ATOL)
    for prompt in batch[:2]:  # and a prompt alone (no seq_idx)
        torch.testing.assert_close(engine.prefill_logits([prompt])[0], hf_logits(hf, prompt), rtol=0, atol=ATOL)
    assert engine.cache.allocator.num_free == 4


def test_concurrent_greedy_decode_matches_transformers(mamba2: Factory) -> None:
    path, hf = mamba2()
    engine = Engine.from_pretrained(path, EngineOptions(num_blocks=4))
    batch = prompts()
    outputs, logits = generate_recording(engine, batch, 32)
    for prompt, out, steps in zip(batch, outputs, logits):
        assert out == hf_greedy(hf, prompt, 32)
        reference = hf_logits(hf, prompt + out)[len(prompt) - 1:-1]  # the logits that chose each token
        torch.testing.assert_close(torch.stack(steps), reference, rtol=0, atol=ATOL)


def test_n_groups_normalize_per_group(mamba2: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.mamba2.modeling_mamba2 import MambaRMSNormGated

    path, hf = mamba2(n_groups=2)
    engine = Engine.from_pretrained(path, EngineOptions(num_blocks=4))
    batch = prompts((9, 4, 17))
    monkeypatch.setattr(MambaRMSNormGated, "forward", gated_norm(None))
    whole = [hf_logits(hf, p) for p in batch]
    monkeypatch.setattr(MambaRMSNormGated, "forward", gated_norm(2))
    ours = engine.prefill_logits(batch)
    for prompt, logits, other in zip(batch, ours, whole):
        torch.testing.assert_close(logits, hf_logits(hf, prompt), rtol=0, atol=ATOL)
        assert (logits - other).abs().max() > 100 * ATOL  # the two norms differ: the test tells them apart
    outputs, logits = generate_recording(engine, batch, 32)
    for prompt, out, steps in zip(batch, outputs, logits):
        assert out == hf_greedy(hf, prompt, 32)
        torch.testing.assert_close(torch.stack(steps), hf_logits(hf, prompt + out)[len(prompt) - 1:-1],
                                   rtol=0, atol=ATOL)


def test_time_step_limit_clamps_prefill_and_decode_alike(mamba2: Factory) -> None:
    """Decode clamps dt to ``time_step_limit`` as prefill does (transformers' decode step skips the clamp),
    so every decode step equals transformers' prefill forward over the same tokens."""
    path, hf = mamba2(time_step_limit=(0.02, 0.06))
    engine = Engine.from_pretrained(path, EngineOptions(num_blocks=4))
    batch = prompts((7, 12))
    outputs, logits = generate_recording(engine, batch, 16)
    for prompt, out, steps in zip(batch, outputs, logits):
        torch.testing.assert_close(torch.stack(steps), hf_logits(hf, prompt + out)[len(prompt) - 1:-1],
                                   rtol=0, atol=ATOL)


def test_gates_resolve_the_recurrent_closure(mamba2: Factory) -> None:
    path, _ = mamba2(n_groups=2)
    config = read_config(path)
    assert config.ssm is not None and config.ssm.group_size == 32 and config.ssm.conv_dim == 128
    chosen = plan(config, EngineOptions(add_norm="fused")).chosen
    ops = {p.op for p in chosen}
    assert ops == {"gemm", "rms_norm", "gemm_add_rms_norm", "rms_norm_gated", "causal_conv1d",
                   "causal_conv1d_update", "selective_scan", "selective_state_update"}  # out_proj + add + norm
    assert {p.fields["hidden_size"] for p in chosen if p.op == "gemm_add_rms_norm"} == {32}
    assert {p.fields["hidden_size"] for p in chosen if p.op == "rms_norm"} == {32}  # the first block's norm
    assert [(p.fields["hidden_size"], p.fields["group_size"]) for p in chosen if p.op == "rms_norm_gated"] == [
        (64, 32)]  # d_inner and d_inner / G
    assert {p.fields["n_groups"] for p in chosen if p.op.startswith("selective")} == {2}


def _copy(src: Path, dst: Path, corrupt: bool = True, **config_changes: object) -> Path:
    shutil.copytree(src, dst)
    if corrupt:  # the gates must fail before any weight is read
        (dst / "model.safetensors").write_bytes(b"not a safetensors file")
    config = json.loads((dst / "config.json").read_text())
    config.update(config_changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_an_n_groups_the_norm_provider_cannot_serve_fails_the_gates(mamba2: Factory, tmp_path: Path) -> None:
    """A provider forced for rms_norm_gated that serves only ``group_size=32``: n_groups=2 (groups of 32) runs,
    n_groups=1 (one group of 64) is refused by the gates, before the corrupt weights are touched."""
    narrow = ("narrow", [("rms_norm_gated", cpu_capability(OneOf("group_size", (32,))), 1,
                          gated_norm_reference)])
    options = EngineOptions(num_blocks=2, providers=(("rms_norm_gated", "narrow"),))
    path, hf = mamba2(n_groups=2)
    with registered(narrow):
        engine = Engine.from_pretrained(path, options)
        assert engine.plan.providers_by_op()["rms_norm_gated"] == "narrow"
        torch.testing.assert_close(engine.prefill_logits([[5, 6, 7]])[0][-1], hf_logits(hf, [5, 6, 7])[-1],
                                   rtol=0, atol=0.1)  # (the patched-norm test checks the values tightly)
        bad = _copy(mamba2()[0], tmp_path / "one-group")
        with pytest.raises(GateError) as err:
            Engine.from_pretrained(bad, options)
    assert "rms_norm_gated" in str(err.value) and "group_size=64" in str(err.value)


def test_unsupported_configs_are_refused(mamba2: Factory, tmp_path: Path) -> None:
    path, _ = mamba2()
    with pytest.raises(ConfigError, match="n_groups=3 must divide num_heads=4"):
        read_config(_copy(path, tmp_path / "groups", n_groups=3))
    with pytest.raises(ConfigError, match="hidden_act='gelu'"):
        read_config(_copy(path, tmp_path / "act", hidden_act="gelu"))


def test_check_reports_the_state_size_per_request_and_reads_no_weights(
        mamba2: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = mamba2()
    bad = zeros_checkpoint(path, tmp_path / "bad")  # valid headers: check reads them, and no tensor data
    headers_only(monkeypatch)
    assert main(["check", "--model", str(bad)]) == 0
    out = capsys.readouterr().out
    # conv: 2 layers x 96 channels x 3 columns x 4 bytes; SSM: 2 layers x 4 heads x 16 x 16 x 4 bytes
    assert "recurrent state per request: 0.010 MiB (conv 2.2 KiB in float32 + SSM 8.0 KiB in float32)" in out
    assert "selective_state_update" in out and "flash_attn" not in out
    assert main(["check", "--model", str(bad), "--provider", "selective_scan=triton"]) == 1
    assert "selective_scan" in capsys.readouterr().err
