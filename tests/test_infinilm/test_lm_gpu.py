"""infinilm on CUDA (``make test-gpu`` runs these): CUDA-graph decode equal to eager decode, logits equal
to transformers'. Skipped on machines without a CUDA device.

The graph tests use head dim 32 (hidden 128, 4 heads), which the Triton attention kernels serve in fp32.
The tiny default (head dim 16) falls to the torch provider's SDPA attention, whose decode path reads the
longest cache length on the host: a CUDA graph cannot capture it, and the last test checks that
the engine then says so, naming the implementation, and decodes the same tokens eagerly.
"""

from __future__ import annotations

import copy

import pytest
import torch
from lm_helpers import FAMILIES, CheckpointFactory

from infinilm import Engine, EngineOptions, SamplingParams
from infinilm.bench import compare_logits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = [[17, 3, 99, 250, 41, 8, 8, 120, 64, 5, 77], [200, 13, 13, 7, 91], [42, 101, 7], [9]]


def _engine(path: object, **options: object) -> Engine:
    return Engine.from_pretrained(path, EngineOptions(**{
        "device": "cuda", "block_size": 16, "num_blocks": 64, "max_model_len": 128, "max_num_seqs": 8, **options}))


# head dim 32 (Triton attention): hidden 128 over 4 heads, or the family's own head_dim
WIDE = {"llama": {"hidden_size": 128}, "qwen2": {"hidden_size": 128}, "qwen3": {"hidden_size": 128},
        "mistral": {"hidden_size": 128}, "glm4": {"hidden_size": 128}, "gemma2": {"hidden_size": 128, "head_dim": 32}}


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_graph_decode_equals_eager_and_logits_match_transformers(checkpoint: CheckpointFactory,
                                                                      family: str) -> None:
    path, hf = checkpoint(family, **WIDE[family])
    graphed, eager = _engine(path), _engine(path, cuda_graphs=False)  # float32, the checkpoint's dtype
    assert graphed.graph_status.startswith("cuda graphs: on"), graphed.graph_status
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    assert graphed.generate(PROMPTS, params) == eager.generate(PROMPTS, params)
    assert graphed.generate(PROMPTS[:3], params) == eager.generate(PROMPTS[:3], params)  # padded to 4
    reference = copy.deepcopy(hf).to("cuda")
    for prompt, logits in zip(PROMPTS, eager.prefill_logits(PROMPTS)):
        with torch.no_grad():
            ref = reference(torch.tensor([prompt], device="cuda")).logits[0]
        torch.testing.assert_close(logits, ref, rtol=0, atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_logits_follow_the_bf16_rule(checkpoint: CheckpointFactory, family: str) -> None:
    """bf16 logits of the same weights against transformers' fp32 forward: infinilm's error within twice
    transformers' own bf16 error (+ 0.01), its argmax as close to fp32's (`infinilm.bench.LogitsCheck`)."""
    path, hf = checkpoint(family, **WIDE[family])
    prompts = [*PROMPTS, torch.randint(0, 255, (100,), generator=torch.Generator().manual_seed(3)).tolist()]
    ours = _engine(path, dtype=torch.bfloat16).prefill_logits(prompts)
    fp32, bf16 = copy.deepcopy(hf).to("cuda"), copy.deepcopy(hf).to("cuda", torch.bfloat16)
    with torch.no_grad():
        theirs = [bf16(torch.tensor([p], device="cuda")).logits[0] for p in prompts]
        reference = [fp32(torch.tensor([p], device="cuda")).logits[0] for p in prompts]
    check = compare_logits(ours, theirs, reference)
    assert check.ok, check.line(family)


def test_bf16_engine_captures_and_generates(checkpoint: CheckpointFactory) -> None:
    path, _ = checkpoint("qwen3")
    engine = _engine(path, dtype=torch.bfloat16)
    assert engine.graph_status.startswith("cuda graphs: on"), engine.graph_status
    outputs = engine.generate(PROMPTS, SamplingParams(max_new_tokens=16, ignore_eos=True))
    assert [len(o) for o in outputs] == [16] * 4
    assert engine.cache.allocator.num_free == 64


def test_graphs_stay_off_only_with_the_synchronizing_implementation_named(checkpoint: CheckpointFactory) -> None:
    path, _ = checkpoint("llama")  # head dim 16: no Triton attention kernel, the torch provider's SDPA serves it
    graphed, eager = _engine(path), _engine(path, cuda_graphs=False)
    attention = next(impl.name for problem, impl in graphed.plan.chosen.items()
                     if problem.op == "flash_attn_with_kvcache")
    status = graphed.graph_status
    explained = status.startswith(f"cuda graphs: off (flash_attn_with_kvcache: {attention} synchronizes with the "
                                  "host at ")
    assert status.startswith("cuda graphs: on") or explained, status
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    assert graphed.generate(PROMPTS, params) == eager.generate(PROMPTS, params)
    assert graphed.cache.allocator.num_free == 64


@pytest.mark.parametrize("graphs", [True, False])
def test_async_scheduling_on_cuda_gives_the_tokens_of_synchronous_steps(checkpoint: CheckpointFactory,
                                                                        graphs: bool) -> None:
    """On CUDA (its default) the next step is launched before this one's ids are read: the same tokens, with
    finishes at different steps, arrivals, an abort, a stop and seeded sampled requests (`test_async_scheduling`
    runs the same on the CPU)."""
    from test_async_scheduling import Req, _both, _hot, _prompts

    path, _ = checkpoint("qwen3", **WIDE["qwen3"])
    p = _prompts(7, seed=5)
    reqs = [Req(p[0], SamplingParams(max_new_tokens=1, ignore_eos=True)), Req(p[1], _hot(1, 9)),
            Req(p[2], SamplingParams(max_new_tokens=12), cancel_after=3), Req(p[3], _hot(3, 12), at=2),
            Req(p[4], _hot(4, 6), at=4), Req(p[5], SamplingParams(max_new_tokens=5, ignore_eos=True), at=4),
            Req(p[6], _hot(6, 8))]
    assert _engine(path).async_scheduling  # the default on CUDA
    _both(lambda **more: _engine(path, cuda_graphs=graphs, **more), reqs)
