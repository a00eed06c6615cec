"""The persistent step inputs (`infinilm.engine.input_batch`): stable rows, block tables kept up to date by the
scheduler, and decode inputs equal to those built from the sequences themselves, in both table layouts, on rank 0
and on a tensor-parallel follower's copy kept from the step broadcasts."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_helpers import CheckpointFactory, replay_on_cpu

from infinilm import Engine, EngineOptions
from infinilm.distributed.step import StepKind, _pack, _unpack
from infinilm.engine.graphs.decode import DecodeGraphs
from infinilm.engine.input_batch import LENGTH, POSITION, ROW, SLOT, TOKEN, SeqRows
from infinilm.engine.kv_cache import BlockAllocator, CacheError
from infinilm.engine.scheduler import Scheduler
from infinilm.engine.sequence import SamplingParams, Sequence

CPU = torch.device("cpu")


def test_rows_are_handed_out_lowest_first_kept_while_running_and_reused_after_release() -> None:
    rows = SeqRows(3, 4, 8, CPU)
    seqs = [Sequence([1 + i], SamplingParams(), i) for i in range(4)]
    for s in seqs:
        s.block_table = [s.id]
    for s in seqs[:3]:
        rows.add(s)
    assert [s.row for s in seqs[:3]] == [0, 1, 2] and rows.num_free == 0
    with pytest.raises(CacheError, match="no free row: all 3 are taken"):
        rows.add(seqs[3])
    assert seqs[3].row is None
    with pytest.raises(CacheError, match="holds row 1 already"):
        rows.add(seqs[1])
    rows.remove(seqs[1])
    rows.remove(seqs[1])  # a second release is nothing
    assert seqs[1].row is None and rows.num_free == 1
    rows.add(seqs[3])
    assert seqs[3].row == 1 and seqs[0].row == 0 and seqs[2].row == 2


def test_a_table_longer_than_a_row_is_refused_before_it_is_written() -> None:
    rows = SeqRows(2, 2, 4, CPU)
    seq = Sequence([1, 2, 3], SamplingParams())
    seq.block_table = [0, 1, 2]
    with pytest.raises(CacheError, match="3 blocks exceeds the 2 a row holds"):
        rows.add(seq)


def _expected(seqs: list[Sequence], block_size: int) -> list[list[int]]:
    """Token, position, slot and length of each decode sequence, from the sequence itself (the old way)."""
    out = []
    for s in seqs:
        p = len(s) - 1
        out.append([s.tokens[-1], p, s.block_table[p // block_size] * block_size + p % block_size, len(s)])
    return out


@pytest.mark.parametrize("transposed", [False, True])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), block_size=st.sampled_from([1, 2, 4, 16]))
def test_decode_inputs_equal_the_sequences_own_through_admissions_preemptions_finishes_and_cancels(
        transposed: bool, seed: int, block_size: int) -> None:
    """A scheduler over few blocks (so it preempts) and few rows runs random prompts with random stop tokens and
    cancellations; at every step the rows' gathered inputs equal what the sequences themselves say."""
    rng = random.Random(seed)
    max_len, max_seqs = 40, 5
    alloc = BlockAllocator(-(-max_len // block_size) * 2, block_size)
    rows = SeqRows(max_seqs, -(-max_len // block_size), block_size, CPU, transposed=transposed)
    follower = SeqRows(max_seqs, -(-max_len // block_size), block_size, CPU, transposed=not transposed)
    sched = Scheduler(alloc, max_num_seqs=max_seqs, max_num_batched_tokens=64, max_model_len=max_len,
                      eos_token_ids=(0,), rows=rows)
    seqs = []
    for i in range(12):
        prompt = [rng.randrange(1, 50) for _ in range(rng.randint(1, 12))]
        seqs.append(Sequence(prompt, SamplingParams(max_new_tokens=rng.randint(1, 20)), i))
        sched.add(seqs[-1])
    for _ in range(400):  # bounded: every request ends within it
        if not sched.has_work():
            break
        batch = sched.schedule()
        running = {s.row: s for s in sched.running}
        assert len(running) == len(sched.running) and None not in running  # one distinct row each
        assert rows.num_free == max_seqs - len(sched.running)
        header, payload = _pack(StepKind.RUN, batch)  # what a tensor-parallel follower receives
        follower.mirror(_unpack(header, payload))
        if batch.decodes:
            idx = SeqRows.rows_of(batch.decodes)
            for r in (rows, follower):
                r.step.np.fill(-7)  # poison the staging buffer: every value read must be written this step
                step, tables = r.decode_step(idx)
                assert step[:ROW].T.tolist() == _expected(batch.decodes, block_size)
                assert step[ROW].tolist() == idx.tolist()
                assert tables.shape == (len(idx), max(len(s.block_table) for s in batch.decodes))
                for s, table in zip(batch.decodes, tables.tolist(), strict=True):
                    assert table[:len(s.block_table)] == s.block_table
        tokens = [0 if rng.random() < 0.05 else rng.randrange(1, 50) for _ in batch.seqs]
        batch.rows = SeqRows.rows_of(batch.seqs)
        rows.advance(batch.rows, tokens)
        sched.postprocess(batch, tokens)
        for s in sched.running:
            assert rows.lens[s.row] == len(s) and rows.last[s.row] == s.tokens[-1]
        if sched.running and rng.random() < 0.1:
            sched.cancel(rng.choice(sched.running))
    assert not sched.has_work() and all(s.row is None for s in seqs)
    assert rows.num_free == max_seqs and alloc.num_free == alloc.num_blocks


def test_recurrent_step_reads_each_rows_state_row() -> None:
    rows = SeqRows(4, 1, 64, CPU)
    seqs = [Sequence([5, 6 + i], SamplingParams(), i) for i in range(3)]
    for s, state_row in zip(seqs, (2, 0, 3), strict=True):
        s.block_table = [state_row]
        rows.add(s)
    rows.remove(seqs[0])
    step = rows.recurrent_step(SeqRows.rows_of(seqs[1:]))
    assert step.tolist() == [[7, 8], [0, 3]]


@pytest.mark.parametrize("transposed", [False, True])
def test_a_launched_steps_ids_are_the_next_decode_tokens_until_they_are_read(transposed: bool) -> None:
    """Async scheduling: after `launched`, a decode step takes a row's token from the pending ids (on the device),
    a row the step did not compute from `last`; `resolved` of the latest step hands every row back to `last`."""
    rows = SeqRows(4, 2, 8, CPU, transposed=transposed)
    seqs = [Sequence([5, 6 + i], SamplingParams(), i) for i in range(3)]
    for i, s in enumerate(seqs):
        s.block_table = [i]
        rows.add(s)
    launched = SeqRows.rows_of([seqs[2], seqs[0]])  # seqs[1] sat out that step
    rows.launched(launched, torch.tensor([40, -1], dtype=torch.int32))  # -1: non-finite logits, token 0 then
    step, _ = rows.decode_step(SeqRows.rows_of(seqs))
    assert step[TOKEN].tolist() == [0, 7, 40] and step[POSITION].tolist() == [2, 1, 2]
    step, _ = rows.decode_step(SeqRows.rows_of([seqs[2], seqs[0]]))  # every row pending: one gather
    assert step[TOKEN].tolist() == [40, 0]
    rows.resolved(launched, [41, 42], latest=True)
    step, _ = rows.decode_step(SeqRows.rows_of(seqs))
    assert step[TOKEN].tolist() == [42, 7, 41] and rows.pending is None


def test_the_staging_rows_are_the_decode_graph_value_rows() -> None:
    """The attention runner's decode graph takes rows token, position, slot, length (its padding's order)."""
    from infinilm.engine.runner import AttentionRunner

    assert (TOKEN, POSITION, SLOT, LENGTH) == (0, 1, 2, 3) and len(AttentionRunner.padding) == ROW
    assert np.array_equal(SeqRows.rows_of([]), np.zeros(0, dtype=np.int64))


@pytest.mark.parametrize("graphs", [False, True])
def test_the_cuda_layout_of_the_tables_gives_the_same_tokens_on_the_cpu(checkpoint: CheckpointFactory,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        graphs: bool) -> None:
    """The transposed tables (CUDA's layout: copied by the width in use, gathered by the device), eager and through
    the decode graphs' static buffers, against the CPU's row layout: the same greedy tokens, with requests of
    different lengths finishing and their rows reused (stale entries past a row's table are never read)."""
    path, _ = checkpoint("qwen3")
    options = EngineOptions(block_size=4, num_blocks=64, max_model_len=64, max_num_seqs=4)
    plain, moved = Engine.from_pretrained(path, options), Engine.from_pretrained(path, options)
    rows = SeqRows(4, moved.rows.max_blocks, 4, CPU, transposed=True)
    moved.rows = moved.scheduler.rows = moved.runner.rows = rows
    if graphs:
        replay_on_cpu(monkeypatch, DecodeGraphs)
        assert moved.runner.capture_graphs(4).startswith("cuda graphs: on")
    prompts = [[5, 9, 200, 4, 4, 4, 4, 4, 4, 4, 1], [17], [33, 8, 8, 1, 90], [64, 2], [7] * 20, [3, 1, 4, 1, 5]]
    for n in (3, 17):
        params = SamplingParams(max_new_tokens=n, ignore_eos=True)
        assert moved.generate(prompts, params) == plain.generate(prompts, params)
    assert rows.tables.transposed and rows.num_free == 4
    if graphs:
        assert sum(g.replays for g, _ in moved.runner.graphs.graphs.values()) > 0


@pytest.mark.parametrize("seed", range(3))
def test_tables_gathered_into_a_static_buffer_hold_each_steps_rows_tables(seed: int) -> None:
    """The CPU decode graphs' tables (`decode_step(tables_out=...)`: all rows written when the step's rows differ
    from the last step's, else only those whose tables changed) hold each step's tables in the step's order, through
    growth, finishes, row reuse, preemption and reordering; the stale entries of the other rows are never read."""
    rng = random.Random(seed)
    alloc = BlockAllocator(num_blocks=14, block_size=2)  # few: preemptions
    rows = SeqRows(6, 16, 2, CPU)
    sched = Scheduler(alloc, max_num_seqs=6, max_num_batched_tokens=64, max_model_len=32, rows=rows)
    out = np.full((6, 16), -7, dtype=np.int32)
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randint(1, 6))] for _ in range(14)]
    for p in prompts:
        sched.add(Sequence(p, SamplingParams(max_new_tokens=rng.randint(1, 12), ignore_eos=True)))
    steps = 0
    while sched.has_work() and steps < 200:
        steps += 1
        batch = sched.schedule()
        decodes = list(batch.decodes)
        if len(decodes) > 2 and rng.random() < 0.2:  # another order of the same sequences
            rng.shuffle(decodes)
        if decodes:
            idx = SeqRows.rows_of(decodes)
            _, none = rows.decode_step(idx, values=True, tables_out=out)
            assert none is None
            for i, s in enumerate(decodes):
                assert out[i, :len(s.block_table)].tolist() == s.block_table
        tokens = [rng.randrange(1, 50) for _ in batch.seqs]
        rows.advance(SeqRows.rows_of(batch.seqs), tokens)
        sched.postprocess(batch, tokens)
    assert not sched.has_work() and sched.num_preemptions > 0
