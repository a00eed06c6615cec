"""Single-prompt prefill graphs of a Mamba-2 engine (`infinilm.engine.graphs.prefill`), on CPU.

The capture seam is replaced by a stand-in whose replay reruns the same forward over the same static
buffers, as a replayed graph does, so the bucket choice, the left padding with ``seq_idx`` -1 and the row
bookkeeping are checked against eager steps without CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lm_helpers import replay_on_cpu
from test_mamba2 import hf_mamba2, prompts

from infinilm import ConfigError, Engine, EngineOptions, SamplingParams
from infinilm.engine.graphs.prefill import PrefillGraphs


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mamba2-prefill-graphs")
    hf_mamba2(seed=7).save_pretrained(str(out))
    return out


def _engine(path: Path, **options: object) -> Engine:
    engine = Engine.from_pretrained(path, EngineOptions(num_blocks=3, max_model_len=64, **options))
    engine.cache.conv.fill_(float("nan"))  # a prefill that read its row would show
    engine.cache.ssm.fill_(float("nan"))
    return engine


def test_lone_prompts_replay_the_smallest_bucket_that_holds_them(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eager, graphed = _engine(path), _engine(path, prefill_graph_lengths=(16, 24))
    replay_on_cpu(monkeypatch, PrefillGraphs)
    assert graphed.runner.capture_prefill_graphs((24, 16)) == "prefill graphs: on (prompt lengths up to 16, 24)"
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    # 16: no padding; 5 and 19: left padding (the scan chunk of 8 then falls elsewhere); 30: eager
    for prompt in prompts((16, 5, 19, 30), seed=21):
        assert graphed.generate([prompt], params) == eager.generate([prompt], params)
    graphs = graphed.runner.prefill_graphs
    assert graphs is not None
    assert {n: g.replays for n, (g, _) in graphs.graphs.items()} == {16: 2, 24: 1}
    for prompt in prompts((11, 24), seed=22):  # the last-token logits, and the final states of the row
        logits = graphed.runner.prefill_graphs.replay(prompt, 2)
        reference = eager.prefill_logits([prompt])[0][-1:]
        torch.testing.assert_close(logits, reference, rtol=0, atol=1e-5)
    assert graphed.cache.allocator.num_free == 3
    # a packed step of two prompts runs eagerly
    batch = prompts((7, 12), seed=23)
    assert graphed.generate(batch, params) == eager.generate(batch, params)
    assert {n: g.replays for n, (g, _) in graphs.graphs.items()} == {16: 3, 24: 2}


def test_the_final_states_are_the_prompts_own(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eager, graphed = _engine(path), _engine(path, prefill_graph_lengths=(32,))
    replay_on_cpu(monkeypatch, PrefillGraphs)
    graphed.runner.capture_prefill_graphs((32,))
    prompt = prompts((13,), seed=24)[0]
    graphed.runner.prefill_graphs.replay(prompt, 1)
    eager.runner.prefill_logits(_one_prefill(eager, prompt, row=1))
    torch.testing.assert_close(graphed.cache.ssm[:, 1], eager.cache.ssm[:, 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(graphed.cache.conv[:, 1], eager.cache.conv[:, 1], rtol=0, atol=1e-6)
    assert torch.isnan(graphed.cache.ssm[:, 2]).all()  # no other row touched (row 0 is the capture's)


def _one_prefill(engine: Engine, prompt: list[int], row: int) -> object:
    from infinilm.engine.scheduler import Batch
    from infinilm.engine.sequence import Sequence

    seq = Sequence(prompt, SamplingParams())
    seq.block_table = [row]
    return Batch(prefills=[seq])


def test_prefill_graphs_are_for_recurrent_models_and_fit_a_step(path: Path, checkpoint: object) -> None:
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        EngineOptions(prefill_graph_lengths=(0,))
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        EngineOptions(prefill_graph_lengths=(64,), max_num_batched_tokens=32)
    llama, _ = checkpoint("llama")  # type: ignore[operator]
    with pytest.raises(ConfigError, match="recurrent"):
        Engine.from_pretrained(llama, EngineOptions(prefill_graph_lengths=(16,)))
