"""The low-precision logits check of the GPU benchmarks (`infinilm.bench.compare_logits`), and the checks of
`infinilm.bench.run_bench`'s arguments."""

from __future__ import annotations

import pytest
import torch
from lm_helpers import CheckpointFactory

from infinilm import Engine, EngineOptions, SamplingParams
from infinilm.bench import AGREE_MARGIN, ERR_FACTOR, check_bench_args, compare_logits, count_decode_step, run_bench


def _logits(gen: torch.Generator, rows: int = 400, vocab: int = 64) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=gen, dtype=torch.float64)


def _noisy(ref: torch.Tensor, scale: float, gen: torch.Generator) -> torch.Tensor:
    return ref + scale * torch.randn(ref.shape, generator=gen, dtype=ref.dtype)


def test_an_error_like_the_references_own_passes_and_a_larger_one_fails() -> None:
    gen = torch.Generator().manual_seed(11)
    refs = [_logits(gen), _logits(gen, rows=97)]
    theirs = [_noisy(r, 0.02, gen) for r in refs]
    same = compare_logits([_noisy(r, 0.02, gen) for r in refs], theirs, refs)
    assert same.ok, same.line()
    assert same.positions == 497 and same.line().startswith("PASS logits vs transformers fp32 over 497 positions")
    worse = compare_logits([_noisy(r, 0.02 * ERR_FACTOR * 3, gen) for r in refs], theirs, refs)
    assert not worse.ok and worse.err_ours > ERR_FACTOR * worse.err_theirs, worse.line()
    assert worse.line().startswith("FAIL")


def test_argmax_agreement_is_judged_against_the_references_own() -> None:
    gen = torch.Generator().manual_seed(12)
    ref = _logits(gen)
    theirs = ref + 10.0  # a large error that keeps every argmax: only the agreement can fail below
    top = ref.argmax(-1)
    flipped = ref.clone()  # the same small error, but every third row's argmax moved to a far lower logit
    rows = torch.arange(0, ref.shape[0], 3)
    flipped[rows, top[rows]] = ref[rows].min(-1).values
    check = compare_logits([flipped], [theirs], [ref])
    assert check.agree_theirs == 1.0 and check.agree_ours < 1.0 - AGREE_MARGIN
    assert check.err_ours <= ERR_FACTOR * check.err_theirs
    assert not check.ok and check.agree_pair == pytest.approx(check.agree_ours)
    # near-tied logits: a low absolute agreement is fine when the reference dtype does no better
    tied = ref * 1e-3
    check = compare_logits([_noisy(tied, 1e-3, gen)], [_noisy(tied, 1e-3, gen)], [tied])
    assert check.agree_theirs < 0.9 and check.ok, check.line()


def test_mismatched_inputs_raise() -> None:
    gen = torch.Generator().manual_seed(13)
    ref = _logits(gen, rows=5)
    with pytest.raises(ValueError, match="prompts"):
        compare_logits([ref], [], [ref])
    with pytest.raises(ValueError, match="shapes"):
        compare_logits([ref[:4]], [ref], [ref])


def test_bench_arguments_are_refused_before_any_prompt_is_made(checkpoint: CheckpointFactory,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed of 2**64 used to fail in torch's manual_seed, and input_len + output_len past max_model_len
    to draw every prompt (a billion-token input_len: gigabytes) before add_request refused the first; a batch
    the KV cache cannot hold drew them too (a billion rows), then preempted."""
    with pytest.raises(ValueError, match=r"seed=18446744073709551616 must be in \[0, 2\*\*64\)"):
        check_bench_args(1, 8, 4, 2**64)
    with pytest.raises(ValueError, match=r"batch=0, output_len=-1: batch, input_len and output_len must be >= 1"):
        check_bench_args(0, 8, -1, 0)
    for args, message in (((2.5, 8, 4, 0), "batch=2.5 must be an int"), ((1, 8, True, 0), "output_len=True must be"),
                          ((1, 8, 4, 1.0), "seed=1.0 must be an int")):  # floats and bools passed these checks
        with pytest.raises(ValueError, match=message):
            check_bench_args(*args)  # type: ignore[arg-type]
    path, _ = checkpoint("llama")
    engine = Engine.from_pretrained(path, EngineOptions(block_size=16, num_blocks=16, max_model_len=64))
    drawn: list[object] = []
    monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: drawn.append(args))
    for seed, sizes, message in ((2**64, (1, 8, 4), "seed="),
                                 (0, (1, 60, 5), r"input_len=60 \+ output_len=5 exceeds max_model_len=64"),
                                 (0, (6, 40, 8), r"batch=6 requests of 40 \+ 8 tokens need 18 cache blocks of 16 "
                                                 "tokens, the cache holds 16")):
        with pytest.raises(ValueError, match=message):
            run_bench(engine, *sizes, seed=seed)
    assert drawn == [] and not engine.has_work()


@pytest.mark.parametrize("mode", ["fused", "separate", "prologue"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "mamba2"])
def test_a_decode_step_makes_the_operator_calls_its_layers_need_and_no_more(checkpoint: CheckpointFactory,
                                                                             family: str, mode: str) -> None:
    """`count_decode_step` counts the operator calls of one decode step by operator: per decoder layer the QKV
    projection, RoPE (fused with the q/k norms for Qwen3), the paged attention (which appends the new keys and
    values: no cache write of its own), the gate/up projection with SiLU-and-multiply (`gemm_swiglu`), and the
    output and down projections each with the residual add and the next norm (`gemm_add_rms_norm`; unfused: the
    two projections, then a fused add + norm before the MLP and before the next layer); per Mamba-2 layer its
    in projection, conv update, state update, gated norm and the out projection with the residual add and the
    next norm (unfused: the projection, then the fused add + norm); the first layer's norm alone before them, the
    last add's norm the final one; then the LM head, and the one sampling call when the requests sample (a greedy
    step takes the argmax: vLLM's all-greedy path). With each norm in the next projection's prologue
    (``add_norm="prologue"``) a decoder layer makes two calls fewer: the QKV and the gate/up (SwiGLU) projections
    each one `rms_norm_gemm`, the output and down projections each one `gemm` adding the residual as ``c``; a
    Mamba-2 layer one fewer (``in_proj`` with the norm, ``out_proj`` with ``c``); the LM head the final norm's
    `rms_norm_gemm`, no `rms_norm` alone.
    A change that adds a launch to the decode step fails here."""
    path, _ = checkpoint(family)
    engine = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=32,
                                                        add_norm=mode))
    count = count_decode_step(engine, 3, 5)
    n = engine.config.num_layers
    fused = mode == "fused"
    if mode == "prologue" and family != "mamba2":
        rope = {"fused_qk_norm_rope": n} if family == "qwen3" else {"rotary_embedding": n}
        want = {"flash_attn_with_kvcache": n, "gemm": 2 * n, "rms_norm_gemm": 2 * n + 1, **rope}
        add_norm = {}
        assert engine.plan.prologue_norm and sum(want.values()) == 6 * n + 1  # separate: 8 per layer, plus 2
    elif mode == "prologue":
        want = {"causal_conv1d_update": n, "gemm": n, "rms_norm_gemm": n + 1, "rms_norm_gated": n,
                "selective_state_update": n}
        add_norm = {}
        assert engine.plan.prologue_norm and sum(want.values()) == 5 * n + 1  # separate: 6 per layer, plus 2
    elif family == "mamba2":
        add_norm = {"gemm_add_rms_norm": n} if fused else {"fused_add_rms_norm": n, "gemm": n}
        want = {"causal_conv1d_update": n, "gemm": n + 1, "rms_norm": 1, "rms_norm_gated": n,
                "selective_state_update": n}
    else:
        rope = {"fused_qk_norm_rope": n} if family == "qwen3" else {"rotary_embedding": n}
        add_norm = {"gemm_add_rms_norm": 2 * n} if fused else {"fused_add_rms_norm": 2 * n, "gemm": 2 * n}
        want = {"flash_attn_with_kvcache": n, "gemm": n + 1, "gemm_swiglu": n, "rms_norm": 1, **rope}
    for op, calls in add_norm.items():
        want[op] = want.get(op, 0) + calls
    assert count.operator_calls == want
    sampled = count_decode_step(engine, 3, 5, params=SamplingParams(max_new_tokens=2, temperature=0.8, top_k=5))
    assert sampled.operator_calls == {**want, "top_k_top_p_sampling_from_logits": 1}  # one batched call per step
    assert (count.batch, count.layers, count.kernels, count.graph_launches) == (3, n, None, 0)
    assert count.line().startswith(f"one decode step of 3: {sum(want.values())} operator calls on the host")
    assert not engine.has_work() and engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    with pytest.raises(ValueError, match="idle engine"):
        engine.add_request([1, 2, 3])
        count_decode_step(engine, 1, 4)
