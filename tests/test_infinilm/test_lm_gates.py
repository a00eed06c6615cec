"""The gates of the attention families: every problem a step can call is in the plan, before any weight."""

from __future__ import annotations

import pytest
from lm_helpers import CheckpointFactory

from infinilm import EngineOptions, read_config
from infinilm.engine.gates import gate_report, plan
from infiniops_py import CandidateReport, GateError, Problem, Rejection, make_problem


@pytest.mark.parametrize(("window", "varlen", "kvcache", "kvcache_unbounded"),
                         [(8, True, True, False), (45, False, True, True), (49, False, False, True)])
def test_local_attention_is_gated_where_the_keys_can_outnumber_the_window(
    checkpoint: CheckpointFactory, window: int, varlen: bool, kvcache: bool, kvcache_unbounded: bool
) -> None:
    """A prefill sees at most max_model_len keys (40), a decode the cache capacity of its blocks (3 x 16 = 48):
    flash-attention keeps the window only where it is shorter than those keys, so a window of 45 is local in
    decode alone and one of 49 nowhere. A decode's block table holds one block at least (16 keys), so a window of
    8 is local in every decode: the traced forward never calls the decode attention without it."""
    path, _ = checkpoint("mistral", sliding_window=window)
    chosen = plan(read_config(path), EngineOptions(block_size=16, max_model_len=40)).chosen
    local = {p.op for p in chosen if p.op.startswith("flash_attn") and p.fields["local"]}
    assert local == {op for op, on in (("flash_attn_varlen", varlen), ("flash_attn_with_kvcache", kvcache)) if on}
    assert {p.op for p in chosen if p.op.startswith("flash_attn") and not p.fields["local"]} == {
        "flash_attn_varlen", *(["flash_attn_with_kvcache"] if kvcache_unbounded else [])}


def test_problems_every_candidate_rejects_for_one_reason_alone_get_a_short_report() -> None:
    """``--device cuda`` on a machine without CUDA printed a 20-line report whose every problem said the same
    thing; it is now that reason once (still a gate report: the CLI exits 1). Other reasons keep the full one."""
    no_cuda = "is not present on this machine (no CUDA device)"

    def gap(op: str, extra: tuple[Rejection, ...] = ()) -> tuple[Problem, list[CandidateReport]]:
        """A problem of `op` whose triton and torch candidates are rejected for the missing device (+ `extra`)."""
        problem = make_problem(op, device_type="cuda", dtype="float32", hidden_size=64)
        fixes = {"triton": "run on a machine with a CUDA GPU", "torch": "run on a machine with a CUDA GPU, or use cpu"}
        return problem, [CandidateReport(name, f"{name}.{op}", 2 - i,
                                         (Rejection("cuda", "device", "cuda", no_cuda, fix), *extra))
                         for i, (name, fix) in enumerate(fixes.items())]

    report = gate_report(GateError([gap("rms_norm"), gap("fused_add_rms_norm")], headline="2 problem(s)"))
    assert report.splitlines() == [
        "gate check failed: this configuration cannot run", "2 problem(s)",
        "every candidate (triton, torch) of every problem (rms_norm, fused_add_rms_norm) is rejected for one reason:",
        f"  device=cuda {no_cuda} (fix: run on a machine with a CUDA GPU, or use cpu)"]
    wide = Rejection("hidden", "hidden_size", 64, "not in {128}")
    mixed = GateError([gap("rms_norm"), gap("fused_add_rms_norm", (wide,))])
    assert gate_report(mixed) == f"gate check failed: this configuration cannot run\n{mixed.render()}"
    assert "hidden_size=64 not in {128}" in gate_report(mixed)


def test_the_plan_lists_the_rope_and_activation_problems_of_each_family(checkpoint: CheckpointFactory) -> None:
    """Each family's RoPE problem is its own (GLM-4: interleaved pairs over half the head), Qwen3's q/k norms take
    it into fused_qk_norm_rope, and only SwiGLU families call gemm_swiglu (Gemma 2's gelu is plain PyTorch), or
    silu_and_mul after the gate/up Gemm where no provider but the reference serves gemm_swiglu."""
    options = EngineOptions(block_size=16, max_model_len=40)

    def fields(family: str, op: str) -> list[dict[str, object]]:
        path, _ = checkpoint(family)
        return [p.fields for p in plan(read_config(path), options).chosen if p.op == op]

    assert fields("llama", "rotary_embedding") == [{"head_dim": 16, "rotary_dim": 16, "is_neox": True}]
    assert fields("glm4", "rotary_embedding") == [{"head_dim": 32, "rotary_dim": 16, "is_neox": False}]
    assert fields("qwen3", "rotary_embedding") == []
    assert fields("qwen3", "fused_qk_norm_rope") == [{"head_dim": 32, "num_q_heads": 4, "num_kv_heads": 2,
                                                      "rotary_dim": 32, "is_neox": True}]
    assert fields("qwen2", "gemm_swiglu") == [{"has_bias": False}]  # the gate/up projection and SiLU in one
    assert fields("qwen2", "silu_and_mul") == []
    assert fields("gemma2", "silu_and_mul") == fields("gemma2", "gemm_swiglu") == []
    unfused = EngineOptions(block_size=16, max_model_len=40, providers=(("gemm_swiglu", "reference"),))
    qwen2 = read_config(checkpoint("qwen2")[0])
    assert [p.fields for p in plan(qwen2, unfused).chosen if p.op == "silu_and_mul"] == [{"d": 96}]


def test_the_projections_into_the_residual_stream_fuse_the_add_and_norm_where_a_provider_serves_it(
        checkpoint: CheckpointFactory) -> None:
    """The o and down projections run with the residual add and the next norm (`gemm_add_rms_norm`, at the
    hidden size) with ``add_norm="fused"`` where a provider other than the reference serves it, leaving no
    `fused_add_rms_norm`; forced onto the reference, or by default (``separate``), the Gemm then
    `fused_add_rms_norm`; Gemma 2 and GLM-4 (a norm after each sub-block) never."""
    options = EngineOptions(block_size=16, max_model_len=40, add_norm="fused")

    def ops(family: str, opts: EngineOptions = options) -> dict[str, list[dict[str, object]]]:
        found = plan(read_config(checkpoint(family)[0]), opts)
        out: dict[str, list[dict[str, object]]] = {}
        for p in found.chosen:
            out.setdefault(p.op, []).append(p.fields)
        assert found.fused_add_norm == ("gemm_add_rms_norm" in out or family in ("gemma2", "glm4"))
        return out

    llama = ops("llama")
    assert {f["hidden_size"] for f in llama["gemm_add_rms_norm"]} == {64}
    assert "fused_add_rms_norm" not in llama
    for family in ("gemma2", "glm4"):
        assert "gemm_add_rms_norm" not in ops(family) and "fused_add_rms_norm" in ops(family)
    unfused = ops("llama", EngineOptions(block_size=16, max_model_len=40, add_norm="fused",
                                         providers=(("gemm_add_rms_norm", "reference"),)))
    assert "gemm_add_rms_norm" not in unfused and "fused_add_rms_norm" in unfused
    default = ops("llama", EngineOptions(block_size=16, max_model_len=40))
    assert "gemm_add_rms_norm" not in default and "fused_add_rms_norm" in default


def test_the_prologue_path_folds_each_norm_into_the_next_projection_where_a_provider_serves_it(
        checkpoint: CheckpointFactory) -> None:
    """With ``add_norm="prologue"`` a pre-norm decoder's qkv and gate/up (SwiGLU) projections and its LM head are
    `rms_norm_gemm` (at K = the hidden size) and o and down a Gemm with ``c``, no `rms_norm` nor
    `fused_add_rms_norm` left, where a provider other than the reference serves them (Mamba-2: ``in_proj`` and the
    head); Gemma 2 and GLM-4 (a norm after each sub-block), or rms_norm_gemm forced onto the reference keep the
    separate path."""
    options = EngineOptions(block_size=16, max_model_len=40, add_norm="prologue")

    def chosen(family: str, opts: EngineOptions = options) -> tuple[bool, dict[str, list[dict[str, object]]]]:
        found = plan(read_config(checkpoint(family)[0]), opts)
        out: dict[str, list[dict[str, object]]] = {}
        for p in found.chosen:
            out.setdefault(p.op, []).append(p.fields)
        return found.prologue_norm, out

    on, qwen3 = chosen("qwen3")
    assert on and {(f["has_bias"], f["swiglu"]) for f in qwen3["rms_norm_gemm"]} == {(False, False), (False, True)}
    assert "fused_add_rms_norm" not in qwen3 and "gemm_swiglu" not in qwen3 and "rms_norm" not in qwen3
    assert any(f["has_c"] for f in qwen3["gemm"])
    for family in ("gemma2", "glm4"):
        on, found = chosen(family)  # the plan may allow it; these layers never take it
        assert "rms_norm_gemm" not in found and "fused_add_rms_norm" in found
    on, mamba2 = chosen("mamba2")
    assert on and "fused_add_rms_norm" not in mamba2 and "rms_norm" not in mamba2
    assert {(f["has_bias"], f["swiglu"]) for f in mamba2["rms_norm_gemm"]} == {(False, False)}
    on, refused = chosen("qwen3", EngineOptions(block_size=16, max_model_len=40, add_norm="prologue",
                                                providers=(("rms_norm_gemm", "reference"),)))
    assert not on and "rms_norm_gemm" not in refused and "fused_add_rms_norm" in refused
