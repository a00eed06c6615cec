"""The decode-graph machinery (static buffers, padding to a captured size, replay), on CPU.

CUDA is not needed to check the bookkeeping: the capture seam is replaced by a stand-in whose replay runs
the same forward over the same static buffers and writes the same output tensor, as a replayed graph does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from fakes import cpu_capability, registered
from infiniops_torch.flash_attn import flash_attn_with_kvcache as torch_flash_attn_with_kvcache
from lm_helpers import CheckpointFactory, replay_on_cpu

from infinilm import Engine, EngineOptions, SamplingParams
from infinilm.engine.graphs import host_sync
from infinilm.engine.graphs.decode import DecodeGraphs, capture_sizes


def test_capture_sizes() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]


def test_padded_graph_replays_give_the_eager_tokens(checkpoint: CheckpointFactory,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = checkpoint("qwen3")
    options = EngineOptions(block_size=8, num_blocks=32, max_model_len=64, max_num_seqs=6)
    eager, graphed = Engine.from_pretrained(path, options), Engine.from_pretrained(path, options)
    replay_on_cpu(monkeypatch, DecodeGraphs)
    assert graphed.runner.capture_graphs(6).startswith("cuda graphs: on (decode batch sizes 1..6, 4 graphs)")
    prompts = [[5, 9, 200, 4], [17], [33, 8, 8, 1, 90, 250, 7, 7, 7], [64, 2]]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    assert graphed.generate(prompts, params) == eager.generate(prompts, params)  # 4 rows: no padding
    before = [c.clone() for c in (*graphed.cache.keys, *graphed.cache.values)]
    eager_before = [c.clone() for c in (*eager.cache.keys, *eager.cache.values)]
    assert graphed.generate(prompts[:3], params) == eager.generate(prompts[:3], params)  # 3 rows padded to 4
    replays = {bs: g.replays for bs, (g, _) in graphed.runner.graphs.graphs.items()}
    assert replays[4] == 2 * 11 and sum(replays.values()) == replays[4]
    assert graphed.cache.allocator.num_free == 32
    # The slots the 3 requests wrote agree within rounding (the CPU's matmul rounds a batch of 4 rows
    # differently from one of 3); every other slot is bit-for-bit what it was: the padding row wrote nothing.
    after = (*graphed.cache.keys, *graphed.cache.values)
    eager_after = (*eager.cache.keys, *eager.cache.values)
    for mine, old, theirs, theirs_old in zip(after, before, eager_after, eager_before):
        written = (theirs != theirs_old).flatten(2).any(-1)  # [num_blocks, block_size]
        assert written.any() and not written.all()
        torch.testing.assert_close(mine[written], theirs[written], rtol=1e-5, atol=1e-5)
        assert torch.equal(mine[~written], old[~written])


def test_decode_graphs_stop_at_the_batch_the_cache_can_hold(checkpoint: CheckpointFactory,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every running sequence holds a block, so no decode step exceeds the cache's blocks: the capture used to
    follow max_num_seqs alone (``--batch 1000000`` on CUDA: static buffers and graphs for a million rows)."""
    path, _ = checkpoint("qwen3")
    engine = Engine.from_pretrained(path, EngineOptions(block_size=16, num_blocks=4, max_model_len=64))
    replay_on_cpu(monkeypatch, DecodeGraphs)
    assert engine.runner.capture_graphs(40) == "cuda graphs: on (decode batch sizes 1..4, 3 graphs)"
    assert engine.runner.graphs is not None and engine.runner.graphs.rows.shape == (4, 4)


def test_a_failed_capture_leaves_the_engine_eager(checkpoint: CheckpointFactory,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = checkpoint("qwen3")
    engine = Engine.from_pretrained(path, EngineOptions(block_size=8, num_blocks=32, max_model_len=64))

    def refuse(self: DecodeGraphs, bs: int, pool: object) -> None:
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(DecodeGraphs, "_capture_one", refuse)
    status = engine.runner.capture_graphs(4)
    assert status == ("cuda graphs: off (capture failed: RuntimeError: operation not permitted when stream is "
                      "capturing)")
    assert engine.runner.graphs is None
    assert len(engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))[0]) == 3


def test_a_capture_failed_by_a_host_sync_names_the_implementation(checkpoint: CheckpointFactory,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture failure seen on the H200, on CPU: an attention implementation that synchronizes; the capture fails
    with a message that names nothing, and the probe names the operator, the implementation and the line."""
    path, _ = checkpoint("llama")
    trap = [False]  # the stand-in of CUDA's sync debug mode: set while the probe runs

    def syncing(*args: object) -> torch.Tensor:
        if trap[0]:
            raise RuntimeError("called a synchronizing CUDA operation")  # what sync debug mode raises
        return torch_flash_attn_with_kvcache(*args)

    @contextlib.contextmanager
    def trapping(device: torch.device) -> Iterator[None]:
        trap[0] = True
        try:
            yield
        finally:
            trap[0] = False

    def refuse(self: DecodeGraphs, bs: int, pool: object) -> None:
        self._forward(bs)  # the capture runs the synchronizing call, then fails without naming it
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    monkeypatch.setattr(host_sync, "syncs_raise", trapping)
    monkeypatch.setattr(DecodeGraphs, "_capture_one", refuse)
    with registered(("synctest", [("flash_attn_with_kvcache", cpu_capability(), 50, syncing)])):
        engine = Engine.from_pretrained(path, EngineOptions(block_size=8, num_blocks=32, max_model_len=64))
        assert engine.plan.providers_by_op()["flash_attn_with_kvcache"] == "synctest"
        status = engine.runner.capture_graphs(4, engine.plan.chosen.values())
        assert status.startswith("cuda graphs: off (flash_attn_with_kvcache: synctest.flash_attn_with_kvcache.0 "
                                 "synchronizes with the host at test_infinilm/test_lm_graphs.py:"), status
        assert status.endswith("`raise RuntimeError(\"called a synchronizing CUDA operation\")  # what sync debug "
                               "mode raises`; a CUDA graph cannot capture a host sync)"), status
        assert engine.runner.graphs is None
        assert len(engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))[0]) == 3


def test_a_capture_failure_without_a_host_sync_reports_the_capture_error(checkpoint: CheckpointFactory,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = checkpoint("qwen3")
    engine = Engine.from_pretrained(path, EngineOptions(block_size=8, num_blocks=32, max_model_len=64))
    probed = []

    @contextlib.contextmanager
    def trapping(device: torch.device) -> Iterator[None]:
        probed.append(device)
        yield

    def refuse(self: DecodeGraphs, bs: int, pool: object) -> None:
        raise RuntimeError("captured a forbidden launch\nmore")

    monkeypatch.setattr(host_sync, "syncs_raise", trapping)
    monkeypatch.setattr(DecodeGraphs, "_capture_one", refuse)
    status = engine.runner.capture_graphs(4, engine.plan.chosen.values())
    assert probed == [engine.device]  # the probe ran once, found no sync
    assert status == "cuda graphs: off (capture failed: RuntimeError: captured a forbidden launch)"
