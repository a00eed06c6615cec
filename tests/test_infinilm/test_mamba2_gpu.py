"""Mamba-2 on CUDA (``make test-gpu`` runs these): CUDA-graph decode equal to eager decode, logits equal to
transformers', bf16 capture. Skipped on machines without a CUDA device."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from test_mamba2 import hf_mamba2, prompts

from infinilm import Engine, EngineOptions, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("mamba2-gpu")
    model = hf_mamba2(seed=5)
    model.save_pretrained(str(path))
    return path, model


def _engine(path: Path, **options: object) -> Engine:
    return Engine.from_pretrained(path, EngineOptions(**{"device": "cuda", "num_blocks": 4, "max_num_seqs": 4,
                                                          **options}))


def test_cuda_graph_decode_equals_eager_and_logits_match_transformers(
        checkpoint: tuple[Path, torch.nn.Module], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # transformers' conv1d, in true fp32
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    path, hf = checkpoint
    graphed, eager = _engine(path), _engine(path, cuda_graphs=False)  # float32, the checkpoint's dtype
    assert graphed.graph_status.startswith("cuda graphs: on"), graphed.graph_status
    batch = prompts((13, 3, 1, 21), seed=2)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    assert graphed.generate(batch, params) == eager.generate(batch, params)
    assert graphed.generate(batch[:3], params) == eager.generate(batch[:3], params)  # padded to 4
    reference = copy.deepcopy(hf).to("cuda")
    for prompt, logits in zip(batch, eager.prefill_logits(batch)):
        with torch.no_grad():
            ref = reference(torch.tensor([prompt], device="cuda")).logits[0]
        torch.testing.assert_close(logits, ref, rtol=0, atol=1e-3)


def test_bf16_engine_captures_and_generates(checkpoint: tuple[Path, torch.nn.Module]) -> None:
    path, _ = checkpoint
    engine = _engine(path, dtype=torch.bfloat16)
    assert engine.graph_status.startswith("cuda graphs: on"), engine.graph_status
    outputs = engine.generate(prompts((9, 30, 2), seed=4), SamplingParams(max_new_tokens=16, ignore_eos=True))
    assert [len(o) for o in outputs] == [16] * 3
    assert engine.cache.allocator.num_free == 4


def test_prefill_graphs_capture_and_give_the_eager_tokens(checkpoint: tuple[Path, torch.nn.Module]) -> None:
    path, _ = checkpoint
    graphed = _engine(path, prefill_graph_lengths=(16, 64), max_model_len=128)
    eager = _engine(path, cuda_graphs=False, max_model_len=128)
    assert "prefill graphs: on (prompt lengths up to 16, 64)" in graphed.graph_status, graphed.graph_status
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    for prompt in prompts((16, 5, 40, 64, 90), seed=6):  # exact, padded to 16, padded to 64, exact, eager
        assert graphed.generate([prompt], params) == eager.generate([prompt], params)
    graphs = graphed.runner.prefill_graphs
    assert graphs is not None
    for prompt in prompts((33, 64), seed=7):
        torch.testing.assert_close(graphs.replay(prompt, 1), eager.prefill_logits([prompt])[0][-1:], rtol=0,
                                   atol=1e-4)
    assert graphed.cache.allocator.num_free == 4
