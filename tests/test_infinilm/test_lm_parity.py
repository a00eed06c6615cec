"""Llama, Qwen2 and Qwen3 checkpoints saved by transformers give transformers' logits and greedy tokens."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from lm_helpers import FAMILIES, CheckpointFactory

import infiniops_py
from infinilm import Engine, EngineOptions, SamplingParams

PROMPTS = ([17, 3, 99, 250, 41, 8, 8, 120, 64, 5, 77], [200, 13, 13, 7, 91, 33, 2, 150, 46, 19, 180, 111, 60, 3, 9,
           244, 71, 128, 30, 22, 6, 212, 85], [42, 101, 7], [9])
STEPS = 32


def _engine(path: object, **options: object) -> Engine:
    return Engine.from_pretrained(path, EngineOptions(block_size=8, num_blocks=64, max_model_len=128, **options))


def _hf_greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(checkpoint: CheckpointFactory, family: str, tied: bool) -> None:
    path, hf = checkpoint(family, tied=tied)
    engine = _engine(path)
    ours = engine.prefill_logits(list(PROMPTS))
    for prompt, logits in zip(PROMPTS, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0]
        assert logits.shape == ref.shape
        torch.testing.assert_close(logits, ref, rtol=0, atol=1e-4)
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_match_transformers_with_continuous_batching(
    checkpoint: CheckpointFactory, family: str, tied: bool
) -> None:
    path, hf = checkpoint(family, tied=tied)
    engine = _engine(path)
    params = SamplingParams(max_new_tokens=STEPS, ignore_eos=True)
    # two requests start together, the others arrive while those decode: their prefills join running decodes
    seqs = [engine.add_request(PROMPTS[0], params), engine.add_request(PROMPTS[1], params)]
    mixed_steps = 0
    for step in range(200):
        if step in (3, 7):
            seqs.append(engine.add_request(PROMPTS[len(seqs)], params))
        outputs = engine.step()
        mixed_steps += any(o.seq.num_output == 1 for o in outputs) and any(o.seq.num_output > 1 for o in outputs)
        if not engine.has_work():
            break
    assert mixed_steps == 2
    for prompt, seq in zip(PROMPTS, seqs):
        assert seq.output == _hf_greedy(hf, prompt), f"prompt of {len(prompt)} tokens"
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_qwen3_fused_and_per_head_qk_norm_give_the_same_logits(checkpoint: CheckpointFactory) -> None:
    path, _ = checkpoint("qwen3")
    fused, per_head = _engine(path, qk_norm="fused"), _engine(path, qk_norm="per_head")
    assert fused.plan.fused_qk_norm and not per_head.plan.fused_qk_norm
    assert "fused_qk_norm" in fused.plan.providers_by_op()
    assert "fused_qk_norm" not in per_head.plan.providers_by_op()
    for a, b in zip(fused.prefill_logits(list(PROMPTS)), per_head.prefill_logits(list(PROMPTS))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_auto_qk_norm_takes_the_fused_path_where_a_provider_serves_it(checkpoint: CheckpointFactory) -> None:
    """fused_qk_norm_rope where a fast provider serves it, else fused_qk_norm, else per-head norms; RoPE is then
    rotary_embedding."""
    path, _ = checkpoint("qwen3")
    plan = _engine(path).plan  # the torch provider serves fused_qk_norm_rope on CPU
    assert plan.fused_qk_norm_rope and not plan.fused_qk_norm
    assert "fused_qk_norm_rope" in plan.providers_by_op() and "rotary_embedding" not in plan.providers_by_op()
    with infiniops_py.use(deny="torch", op="fused_qk_norm_rope"):  # only the reference is left: not a fast path
        plan = _engine(path).plan
        assert plan.fused_qk_norm and not plan.fused_qk_norm_rope and "rotary_embedding" in plan.providers_by_op()
    with infiniops_py.use(deny="torch", op=("fused_qk_norm_rope", "fused_qk_norm")):
        plan = _engine(path).plan
        assert not plan.fused_qk_norm and not plan.fused_qk_norm_rope and "rotary_embedding" in plan.providers_by_op()


def test_qwen3_norms_fused_with_rope_and_separate_give_the_same_logits(checkpoint: CheckpointFactory) -> None:
    path, _ = checkpoint("qwen3")
    with_rope, separate = _engine(path), _engine(path, qk_norm="fused")
    assert with_rope.plan.fused_qk_norm_rope and not separate.plan.fused_qk_norm_rope
    for a, b in zip(with_rope.prefill_logits(list(PROMPTS)), separate.prefill_logits(list(PROMPTS))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


class _NoBiasGemm:
    """A provider whose gemm cannot fuse a bias: the model must run gemm, then a broadcast add."""

    calls: ClassVar[list[bool]] = []

    @infiniops_py.hookimpl
    def infiniops_provider(self) -> infiniops_py.Provider:
        def gemm(a, b, c, bias, alpha, beta, trans_a, trans_b, out):  # type: ignore[no-untyped-def]
            _NoBiasGemm.calls.append(bias is not None)
            return torch.matmul(a, b.t() if trans_b else b, out=out)

        cap = infiniops_py.Capability(infiniops_py.OneOf("has_bias", (False,)), infiniops_py.OneOf("has_c", (False,)),
                                      infiniops_py.OneOf("trans_a", (False,)))
        impl = infiniops_py.Implementation("gemm", "nobias", "nobias.gemm", cap, 5, gemm)
        return infiniops_py.Provider(name="nobias", implementations=[impl])


def test_bias_without_a_fused_gemm_runs_gemm_then_add(checkpoint: CheckpointFactory) -> None:
    path, hf = checkpoint("qwen2")
    infiniops_py.register_provider(_NoBiasGemm(), name="nobias")
    try:
        engine = _engine(path, providers=(("gemm", "nobias"),))
        assert not engine.plan.fused_bias
        assert engine.plan.providers_by_op()["gemm"] == "nobias" and "add" in engine.plan.providers_by_op()
        _NoBiasGemm.calls.clear()
        logits = engine.prefill_logits([PROMPTS[0]])[0]
    finally:
        infiniops_py.unregister_provider("nobias")
    assert _NoBiasGemm.calls and not any(_NoBiasGemm.calls)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(torch.tensor([PROMPTS[0]])).logits[0], rtol=0, atol=1e-4)
