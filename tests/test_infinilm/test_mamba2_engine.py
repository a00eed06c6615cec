"""The recurrent state pool under the engine: admission when rows run out, cancellation, release, reuse.

Every request's tokens must equal the same request run alone; the pool starts poisoned with NaN, so a
prefill that read its (reused) row, or a decode that read another request's row, would show.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lm_helpers import replay_on_cpu
from test_mamba2 import hf_mamba2, prompts

from infinilm import Engine, EngineOptions, FinishReason, SamplingParams, read_config
from infinilm.engine.graphs.decode import DecodeGraphs
from infinilm.engine.state_pool import StatePool, state_bytes
from infinilm.layers import ssm


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mamba2-engine")
    hf_mamba2(seed=3).save_pretrained(str(out))
    return out


def _engine(path: Path, rows: int, **options: object) -> Engine:
    engine = Engine.from_pretrained(path, EngineOptions(num_blocks=rows, **options))
    engine.cache.conv.fill_(float("nan"))
    engine.cache.ssm.fill_(float("nan"))
    return engine


def _alone(path: Path, batch: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    engine = _engine(path, 1)
    return [engine.generate([p], q)[0] for p, q in zip(batch, params)]


def test_several_prompts_prefill_as_one_packed_row(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step of several prompts runs, per layer, one packed conv over the prompts' tokens (its states written
    into the prompts' rows) and one cu_seqlens scan (their final states from return_varlen_states): no
    padded grid; each prompt's logits are those of its own prefill."""
    assert ssm.prefill_starts([3, 1, 2]) == [0, 3, 4, 6] and ssm.prefill_starts([4]) == [0, 4]
    calls: list[tuple[str, list[int] | None]] = []

    def spy(name: str, real: object, key: str) -> object:
        def call(*args: object, **kwargs: object) -> object:
            packed = kwargs.get(key)
            calls.append((name, None if packed is None else packed.tolist()))
            return real(*args, **kwargs)
        return call

    engine = _engine(path, 4)  # first: its gates trace the forward on meta tensors, which the spies would see
    monkeypatch.setattr(ssm, "causal_conv1d", spy("conv", ssm.causal_conv1d, "query_start_loc"))
    monkeypatch.setattr(ssm, "selective_scan", spy("scan", ssm.selective_scan, "cu_seqlens"))
    batch = [[5, 9, 2, 7, 1], list(range(3, 12)), [4, 4]]
    packed = engine.prefill_logits(batch)
    layers = engine.cache.conv.shape[0]
    assert calls == [("conv", [0, 5, 14, 16]), ("scan", [0, 5, 14, 16])] * layers
    for prompt, logits in zip(batch, packed):
        torch.testing.assert_close(logits, engine.prefill_logits([prompt])[0], rtol=1e-5, atol=1e-5)


def test_pool_rows_and_state_size(path: Path) -> None:
    config = read_config(path)
    pool = StatePool(config, 3, 64, dtype=torch.bfloat16, device="cpu")
    assert pool.conv.shape == (2, 3, 96, 3) and pool.conv.dtype == torch.bfloat16  # [layers, rows, conv_dim, W-1]
    assert pool.ssm.shape == (2, 3, 4, 16, 16) and pool.ssm.dtype == torch.float32  # [layers, rows, H, P, N]
    assert state_bytes(config, torch.bfloat16) == (2 * 96 * 3 * 2, 2 * 4 * 16 * 16 * 4)
    assert pool.num_rows == 3 and pool.allocator.blocks_needed(64) == 1  # one row holds a whole sequence
    sized = StatePool.for_engine(config, EngineOptions(max_num_seqs=5, kv_cache_memory=2 * sum(state_bytes(
        config, torch.float32))), torch.device("cpu"))
    assert sized.num_rows == 2  # the memory budget, then max_num_seqs, bound the rows


def test_exhausted_rows_queue_requests_and_every_output_matches_its_solo_run(path: Path) -> None:
    engine = _engine(path, 2)
    batch = prompts((5, 11, 1, 8, 3), seed=7)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (6, 3, 9, 4, 7)]
    seqs = [engine.add_request(p, q) for p, q in zip(batch, params)]
    mixed = False
    while engine.has_work():
        outs = engine.step()
        running = engine.scheduler.running
        assert len(running) <= 2 and engine.cache.allocator.num_free == 2 - len(running)
        assert len({StatePool.row(s) for s in running}) == len(running)  # rows are never shared
        mixed |= len(outs) == 2 and any(o.seq.num_output == 1 for o in outs) and any(
            o.seq.num_output > 1 for o in outs)
    assert mixed  # some step decoded one request while prefilling another
    assert [s.output for s in seqs] == _alone(path, batch, params)
    assert all(s.finish_reason is FinishReason.LENGTH for s in seqs)
    assert engine.cache.allocator.num_free == 2


def test_cancellation_frees_the_row_for_a_waiting_request(path: Path) -> None:
    engine = _engine(path, 2)
    batch = prompts((6, 2, 9, 4), seed=11)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    a, b, c, d = (engine.add_request(p, params) for p in batch)
    engine.step()
    engine.step()
    assert c in engine.scheduler.waiting and engine.cache.allocator.num_free == 0
    assert engine.cancel(d) and d.finish_reason is FinishReason.CANCELLED  # waiting: never got a row
    assert engine.cancel(a) and not engine.cancel(a)  # running: its row goes back
    assert engine.cache.allocator.num_free == 1
    outs = engine.step()
    assert {o.seq.id for o in outs} == {b.id, c.id}  # c took a's row in the very next step
    for _ in engine.stream():
        pass
    solo = _alone(path, batch, [params] * 4)
    assert a.output == solo[0][:2] and b.output == solo[1] and c.output == solo[2] and d.output == []
    assert engine.cache.allocator.num_free == 2


def test_eos_and_stop_tokens_release_rows(path: Path) -> None:
    engine = _engine(path, 1)
    prompt = prompts((5,), seed=5)[0]
    free_run = engine.generate([prompt], SamplingParams(max_new_tokens=6, ignore_eos=True))[0]
    seq = engine.add_request(prompt, SamplingParams(max_new_tokens=6, stop_token_ids=(free_run[2],)))
    waiting = engine.add_request(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True))
    for _ in engine.stream():
        pass
    assert seq.output == free_run[: free_run.index(free_run[2]) + 1] and seq.finish_reason is FinishReason.EOS
    assert waiting.output == free_run and engine.cache.allocator.num_free == 1  # the row was reused


def test_padded_graph_replays_give_the_eager_tokens_and_touch_no_other_row(path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    eager, graphed = _engine(path, 4), _engine(path, 4)
    replay_on_cpu(monkeypatch, DecodeGraphs)
    assert graphed.runner.capture_graphs(8) == "cuda graphs: on (decode batch sizes 1..4, 3 graphs)"
    batch = prompts((4, 9, 1), seed=13)
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    assert graphed.generate(batch, params) == eager.generate(batch, params)  # 3 rows padded to 4
    replays = {bs: g.replays for bs, (g, _) in graphed.runner.graphs.graphs.items()}
    assert replays[4] == 9 and sum(replays.values()) == 9
    used = [r for r in range(4) if not eager.cache.ssm[:, r].isnan().all()]
    assert used == [0, 1, 2]  # one row per request; row 3 no request held
    for mine, theirs in ((graphed.cache.conv, eager.cache.conv), (graphed.cache.ssm, eager.cache.ssm)):
        # the CPU's matmul rounds a batch of 4 rows differently from one of 3: the used rows agree within rounding
        torch.testing.assert_close(mine[:, used], theirs[:, used], rtol=1e-5, atol=1e-5)
        assert mine[:, 3].isnan().all()  # bit-for-bit the NaN poison: the padding row (-1) wrote nothing
