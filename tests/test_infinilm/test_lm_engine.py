"""The engine under pressure: admission control, preemption, cancellation, stops, and a 500-request soak."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from lm_helpers import CheckpointFactory

from infinilm import ConfigError, Engine, EngineOptions, FinishReason, SamplingParams, read_config
from infinilm.engine import check_options, max_positions
from infinilm.engine import memory as cache_module
from infinilm.engine.kv_cache import BlockAllocator
from infinilm.engine.scheduler import Scheduler
from infinilm.engine.sequence import SeqStatus, Sequence


def _engine(checkpoint: CheckpointFactory, **options: object) -> Engine:
    path, _ = checkpoint("llama")
    return Engine.from_pretrained(path, EngineOptions(**{"block_size": 8, "max_model_len": 64, **options}))


def _prompts(n: int, seed: int, lo: int = 1, hi: int = 15) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 255) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def test_exhausted_blocks_queue_requests_and_every_output_stays_right(checkpoint: CheckpointFactory) -> None:
    prompts = _prompts(6, seed=1, lo=5, hi=15)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    roomy = _engine(checkpoint, num_blocks=64)
    expected = [roomy.generate([p], params)[0] for p in prompts]

    tight = _engine(checkpoint, num_blocks=8)  # 64 token slots: about two of these requests at a time
    seqs = [tight.add_request(p, params) for p in prompts]
    queued_while_running = 0
    while tight.has_work():
        tight.step()
        sched = tight.scheduler
        queued_while_running += bool(sched.waiting and sched.running)
        assert tight.cache.allocator.num_free + sum(len(s.block_table) for s in sched.running) == 8
    assert queued_while_running > 0
    assert tight.scheduler.num_preemptions > 0  # decodes outgrew the cache: recompute preemption ran
    assert [s.output for s in seqs] == expected
    assert all(s.finish_reason is FinishReason.LENGTH for s in seqs)
    assert tight.cache.allocator.num_free == 8


def test_cancellation_frees_blocks_of_running_and_waiting_requests(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=16, max_num_seqs=2)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    a, b, c = (engine.add_request(p, params) for p in _prompts(3, seed=2, lo=9, hi=12))
    engine.step()
    engine.step()
    assert a.status is SeqStatus.RUNNING and c.status is SeqStatus.WAITING
    free, held = engine.cache.allocator.num_free, len(a.block_table)
    assert held > 0 and engine.cancel(a)
    assert engine.cache.allocator.num_free == free + held and a.block_table == []
    assert engine.cancel(c) and c not in engine.scheduler.waiting
    assert not engine.cancel(a)  # already finished
    while engine.has_work():
        engine.step()
    assert (a.finish_reason, b.finish_reason, c.finish_reason) == (
        FinishReason.CANCELLED, FinishReason.LENGTH, FinishReason.CANCELLED)
    assert c.output == [] and b.num_output == 20
    assert engine.cache.allocator.num_free == 16


def test_stop_tokens_and_eos_end_a_request(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=32)
    prompt = _prompts(1, seed=3)[0]
    free_run = engine.generate([prompt], SamplingParams(max_new_tokens=10, ignore_eos=True))[0]
    stop = free_run[3]
    seq = engine.add_request(prompt, SamplingParams(max_new_tokens=10, stop_token_ids=(stop,)))
    list(engine.stream())
    assert seq.output == free_run[: free_run.index(stop) + 1]
    assert seq.finish_reason is FinishReason.EOS
    # ignore_eos ignores the model's EOS ids only: a stop token still ends the request (vLLM's semantics; this
    # once asserted that ignore_eos ran past the stop token to max_new_tokens)
    ignoring = engine.add_request(prompt, SamplingParams(max_new_tokens=10, stop_token_ids=(stop,), ignore_eos=True))
    list(engine.stream())
    assert ignoring.output == seq.output and ignoring.finish_reason is FinishReason.EOS


def test_ignore_eos_skips_only_the_eos_ids_while_stop_tokens_and_max_new_tokens_still_end_a_request() -> None:
    """vLLM's ``check_stop``: ``ignore_eos`` skips the model's EOS ids, never ``stop_token_ids`` (ignore_eos
    used to disable the stop tokens as well); the length limit is checked before the stop tokens (a stop token
    drawn as the last allowed token ends the request as LENGTH, "length" when served, as vLLM reports it)."""
    eos, stop, other = 7, 9, 3
    scheduler = Scheduler(BlockAllocator(num_blocks=16, block_size=4), max_num_seqs=8, max_num_batched_tokens=64,
                          max_model_len=32, eos_token_ids=(eos,))
    seqs = {name: Sequence([1, 2], params, i) for i, (name, params) in enumerate({
        "eos": SamplingParams(max_new_tokens=3),
        "ignoring_eos": SamplingParams(max_new_tokens=3, ignore_eos=True, stop_token_ids=(stop,)),
        "stopped": SamplingParams(max_new_tokens=3, ignore_eos=True, stop_token_ids=(stop,)),
        "eos_listed_as_stop": SamplingParams(max_new_tokens=3, ignore_eos=True, stop_token_ids=(eos,)),
        "stop_at_the_limit": SamplingParams(max_new_tokens=2, stop_token_ids=(stop,)),
    }.items())}
    for seq in seqs.values():
        scheduler.add(seq)
    steps = {"eos": [eos, other, other], "ignoring_eos": [eos, other, eos], "stopped": [eos, stop, other],
             "eos_listed_as_stop": [eos, other, other], "stop_at_the_limit": [other, stop, other]}  # steps 1-3
    name_of = {seq.id: name for name, seq in seqs.items()}
    for step in range(3):
        batch = scheduler.schedule()
        scheduler.postprocess(batch, [steps[name_of[s.id]][step] for s in batch.seqs])
    assert {name: (seq.output, seq.finish_reason) for name, seq in seqs.items()} == {
        "eos": ([eos], FinishReason.EOS),
        "ignoring_eos": ([eos, other, eos], FinishReason.LENGTH),  # past two EOS ids, to max_new_tokens
        "stopped": ([eos, stop], FinishReason.EOS),  # the stop token ends it: finish_reason "stop" when served
        "eos_listed_as_stop": ([eos], FinishReason.EOS),
        "stop_at_the_limit": ([other, stop], FinishReason.LENGTH),  # the length limit is checked first
    }
    assert not scheduler.has_work() and scheduler.allocator.num_free == 16


def test_seeded_sampling_is_reproducible_across_batches(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=32)
    prompt, other = _prompts(2, seed=4)
    hot = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    alone = engine.generate([prompt], hot)[0]
    together = engine.generate([other, prompt], hot)[1]
    assert alone == together


def test_requests_that_can_never_run_are_rejected_up_front(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=8)
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([1, 256])
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request([1] * 64)
    assert not engine.has_work()


def test_prefill_logits_refuses_a_prompt_longer_than_max_model_len_before_any_kernel(
    checkpoint: CheckpointFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """add_request refused such a prompt; prefill_logits ran it into an IndexError of the RoPE table."""
    engine = _engine(checkpoint, num_blocks=32)  # blocks enough for 256 tokens: only the positions are short
    assert len(engine.prefill_logits([[1] * 64])[0]) == 64  # max_model_len tokens fit: no room to generate needed
    free = engine.cache.allocator.num_free
    monkeypatch.setattr(engine.runner, "prefill_logits", lambda batch: pytest.fail("a kernel ran"))
    with pytest.raises(ValueError, match=r"^prompts\[1\]: 65 tokens exceed max_model_len=64 "):
        engine.prefill_logits([[1, 2], [1] * 65])
    assert engine.cache.allocator.num_free == free and not engine.has_work()


def test_prompts_whose_ids_are_not_vocabulary_integers_raise_value_error(checkpoint: CheckpointFactory) -> None:
    """prefill_logits used to raise IndexError from the embedding, and add_request took floats."""
    engine = _engine(checkpoint, num_blocks=8)
    for bad, message in (([10**6], r"prompts\[0\]: token id\(s\) \[1000000\] outside the vocabulary \[0, 256\)"),
                         ([-1, 3], r"prompts\[0\]: token id\(s\) \[-1\] outside"),
                         ([1.7, 2.2], r"prompts\[0\]: token id\(s\) \[1.7, 2.2\] are not integers")):
        with pytest.raises(ValueError, match=message):
            engine.prefill_logits([bad])
    with pytest.raises(ValueError, match=r"prompts\[1\]: needs at least one token"):
        engine.prefill_logits([[1], []])
    with pytest.raises(ValueError, match="needs at least one prompt"):
        engine.prefill_logits([])
    for bad in ([1.7, 2.2], [True, 3], ["5"]):
        with pytest.raises(ValueError, match=r"prompt: token id\(s\) .* are not integers"):
            engine.add_request(bad)
    assert not engine.has_work() and engine.cache.allocator.num_free == 8
    seq = engine.add_request([np.int64(5), torch.tensor(9)])  # integer scalars are ids
    assert seq.tokens == [5, 9] and all(type(t) is int for t in seq.tokens)
    engine.cancel(seq)
    assert len(engine.prefill_logits([[np.int32(7), 8]])[0]) == 2


def test_engine_options_take_dtype_names_and_refuse_unknown_devices(checkpoint: CheckpointFactory,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A dtype string used to pass EngineOptions and fail deep in the model build; a bad device in torch."""
    options = EngineOptions(dtype="bfloat16")
    assert options.dtype is torch.bfloat16 and EngineOptions(dtype="fp16").dtype is torch.float16
    engine = _engine(checkpoint, num_blocks=8, dtype="bf16")
    assert engine.cache.keys[0].dtype is torch.bfloat16
    assert {t.dtype for t in engine.model.targets().values()} == {torch.bfloat16}
    for bad in ("float64", torch.int8, "banana"):
        with pytest.raises(ConfigError, match=r"dtype .* is not supported; use one of float32, bfloat16, float16"):
            EngineOptions(dtype=bad)
    for device in ("banana", "", "cuda:x", "meta", "mps"):
        with pytest.raises(ConfigError, match=rf"device={device!r} is not a device the engine runs on; use cpu, cuda"):
            EngineOptions(device=device)
    assert EngineOptions(device="cuda:1").device == "cuda:1"  # a well-formed name: the index is checked later
    path, _ = checkpoint("llama")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"device='cuda:2': this machine has 2 CUDA device\(s\), cuda:0 .. cuda:1"):
        check_options(read_config(path), EngineOptions(device="cuda:2"))


def test_max_model_len_beyond_the_positions_the_model_serves_is_refused(checkpoint: CheckpointFactory,
                                                                        tmp_path: Path) -> None:
    """--max-model-len 1000000000 used to allocate the RoPE table of a billion positions and fail in torch."""
    path, _ = checkpoint("llama")  # max_position_embeddings 256
    with pytest.raises(ConfigError, match=r"max_model_len=1000000000 exceeds the 256 positions this llama model "
                                          r"serves \(max_position_embeddings=256 in config.json\); lower"):
        Engine.from_pretrained(path, EngineOptions(max_model_len=10**9))
    assert _engine(checkpoint, num_blocks=32, max_model_len=256).scheduler.max_model_len == 256
    # linear and yarn RoPE scaling stretch the positions by their factor (yarn: of the original length)
    scaled = tmp_path / "yarn"
    shutil.copytree(path, scaled)
    config = json.loads((scaled / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    (scaled / "config.json").write_text(json.dumps(config))
    yarn = read_config(scaled)
    assert max_positions(yarn) == 512
    check_options(yarn, EngineOptions(max_model_len=512))
    with pytest.raises(ConfigError, match=r"exceeds the 512 positions .* x its yarn RoPE factor"):
        check_options(yarn, EngineOptions(max_model_len=513))


def test_a_cache_that_cannot_fit_the_memory_is_refused_before_it_is_allocated(
    checkpoint: CheckpointFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--num-blocks 1000000000 used to load the weights, then fail in torch's allocator."""
    from test_mamba2 import hf_mamba2

    path, _ = checkpoint("llama")
    garbage = tmp_path / "garbage"  # weights that cannot be read: the refusal must come before them
    garbage.mkdir()
    shutil.copy(path / "config.json", garbage)
    (garbage / "model.safetensors").write_bytes(b"\xff" * 64)
    per_block = 2 * 2 * 16 * 2 * 16 * 4  # K and V x layers x block_size x Hkv x head_dim x float32
    with pytest.raises(ConfigError, match=rf"num_blocks=1000000000: the KV cache \(1000000000 x {per_block} bytes\) "
                                          rf"needs {10**9 * per_block} bytes \(7.45 TiB\), more than the \d+ bytes "
                                          r".* of total memory on cpu; lower num_blocks"):
        Engine.from_pretrained(garbage, EngineOptions(block_size=16, num_blocks=10**9, max_model_len=64))
    mamba2 = tmp_path / "mamba2"
    hf_mamba2(seed=3).save_pretrained(str(mamba2))
    (mamba2 / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ConfigError, match=r"num_blocks=1000000000: the state pool \(1000000000 x \d+ bytes\) needs"):
        Engine.from_pretrained(mamba2, EngineOptions(num_blocks=10**9))
    # just before allocating, the bound is the memory available now (here: less than one 8-block cache)
    monkeypatch.setattr(cache_module, "device_memory", lambda device: (8 * per_block - 1, 2**40))
    with pytest.raises(ConfigError, match=rf"num_blocks=8: the KV cache .* needs {8 * per_block} bytes .* of "
                                          "available memory on cpu"):
        Engine.from_pretrained(path, EngineOptions(block_size=16, num_blocks=8, max_model_len=64))
    assert Engine.from_pretrained(path, EngineOptions(block_size=16, num_blocks=7, max_model_len=64))


def test_soak_of_500_short_requests_leaves_every_block_free(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=24, max_num_seqs=32, block_size=4)
    rng = random.Random(5)
    prompts = _prompts(500, seed=6, lo=1, hi=8)
    seqs, cancelled = [], set()
    pending = list(prompts)
    while pending or engine.has_work():
        for _ in range(rng.randint(0, 40)):
            if pending:
                params = SamplingParams(max_new_tokens=rng.randint(1, 6), ignore_eos=rng.random() < 0.5)
                seqs.append(engine.add_request(pending.pop(), params))
        engine.step()
        if seqs and rng.random() < 0.3:
            victim = rng.choice(seqs)
            if engine.cancel(victim):
                cancelled.add(victim.id)
    assert len(seqs) == 500 and all(s.finished for s in seqs)
    for s in seqs:
        if s.id in cancelled:
            assert s.finish_reason is FinishReason.CANCELLED
        elif s.finish_reason is FinishReason.LENGTH:
            assert s.num_output == s.params.max_new_tokens
        else:
            assert s.output[-1] in engine.config.eos_token_ids and not s.params.ignore_eos
    assert cancelled
    assert engine.cache.allocator.num_free == 24
    assert not engine.scheduler.waiting and not engine.scheduler.running


def test_unchecked_index_mode_gives_the_same_tokens(checkpoint: CheckpointFactory,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from infiniops_py.operators import _base

    seen: list[bool] = []
    real = _base.is_checked
    monkeypatch.setattr(_base, "is_checked", lambda device: seen.append(real(device)) or seen[-1])
    prompts = _prompts(3, seed=8)
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    checked = _engine(checkpoint, num_blocks=16).generate(prompts, params)
    assert seen and all(seen)  # the default on CPU: every index is range-checked
    seen.clear()
    assert _engine(checkpoint, num_blocks=16, check_indices=False).generate(prompts, params) == checked
    assert seen and not any(seen)


@pytest.mark.parametrize("seed", range(4))
def test_postprocess_applies_the_stop_rules_to_random_steps_as_written(seed: int) -> None:
    """`Scheduler.postprocess` (its whole-step path, and the per-sequence loop a -1 token sends a step to) against
    the rules written out per sequence: -1 is an error, then the length limit (``max_new_tokens`` or
    ``max_model_len``) before the stop tokens and the EOS ids unless ``ignore_eos``."""
    rng = random.Random(seed)
    eos, max_len = (5, 6), 14
    scheduler = Scheduler(BlockAllocator(num_blocks=64, block_size=4), max_num_seqs=12, max_num_batched_tokens=256,
                          max_model_len=max_len, eos_token_ids=eos)
    seqs = [Sequence([1] * rng.randint(1, 6), SamplingParams(
        max_new_tokens=rng.randint(1, 10), ignore_eos=rng.random() < 0.5,
        stop_token_ids=tuple(rng.sample(range(8), rng.randint(0, 2)))), i) for i in range(12)]
    for seq in seqs:
        scheduler.add(seq)
    expect: dict[int, tuple[list[int], FinishReason]] = {}
    while scheduler.has_work():
        batch = scheduler.schedule()
        tokens = [rng.randrange(8) if rng.random() > 0.03 else -1 for _ in batch.seqs]
        for seq, token in zip(batch.seqs, tokens):
            out = [*seq.output, token]
            p = seq.params
            if token < 0:
                expect[seq.id] = (out[:-1], FinishReason.ERROR)
            elif len(out) >= p.max_new_tokens or seq.num_prompt + len(out) >= max_len:
                expect[seq.id] = (out, FinishReason.LENGTH)
            elif token in p.stop_token_ids or (not p.ignore_eos and token in eos):
                expect[seq.id] = (out, FinishReason.EOS)
        finished = scheduler.postprocess(batch, tokens)
        assert {s.id for s in finished} == {s.id for s in batch.seqs if s.id in expect and s.finished}
    assert {s.id: (s.output, s.finish_reason) for s in seqs} == expect
    assert scheduler.allocator.num_free == 64 and not scheduler.running


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "mamba2"])
def test_the_fused_residual_add_and_norm_give_the_unfused_tokens(checkpoint: CheckpointFactory, family: str,
                                                                 dtype: str) -> None:
    """The o/down projections (Mamba-2: out_proj) with the residual add and the next norm in one
    `gemm_add_rms_norm` (``add_norm="fused"``) give the greedy tokens of the Gemm then `fused_add_rms_norm` (the
    default), prefill and decode, in float32 and bfloat16."""
    path, _ = checkpoint(family)
    vocab = read_config(path).vocab_size
    prompts = [[t % vocab for t in p] for p in _prompts(4, seed=9, lo=2, hi=12)]
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    outputs = []
    for add_norm in ("fused", "separate"):
        engine = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=32,
                                                            dtype=dtype, add_norm=add_norm))
        assert engine.plan.fused_add_norm == (add_norm == "fused")
        outputs.append(engine.generate(prompts, params))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("family", ["llama", "qwen3", "mamba2"])
def test_the_norms_in_the_next_projections_prologue_give_the_separate_paths_tokens_and_logits(
        checkpoint: CheckpointFactory, family: str) -> None:
    """Each norm in the next projection's prologue (``add_norm="prologue"``: `rms_norm_gemm` for qkv, gate/up and
    the LM head, `gemm` with ``c`` for o and down; Mamba-2: in_proj and out_proj) gives the separate path's greedy
    tokens in float32 (the Gemm's fp32 add of ``c`` rounds as the projection then the add do); in bfloat16 the Gemm
    adds ``c`` before its one rounding where the separate path rounds the projection first, so the prefill logits
    are compared instead, within a bfloat16 model's rounding (2% of the logits' range)."""
    path, _ = checkpoint(family)
    vocab = read_config(path).vocab_size
    prompts = [[t % vocab for t in p] for p in _prompts(4, seed=9, lo=2, hi=12)]
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    for dtype in ("float32", "bfloat16"):
        outputs, logits = [], []
        for add_norm in ("prologue", "separate"):
            engine = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=32,
                                                                dtype=dtype, add_norm=add_norm))
            assert engine.plan.prologue_norm == (add_norm == "prologue")
            assert engine.model.prologue_norm == (add_norm == "prologue")
            logits.append(torch.cat([t.float() for t in engine.prefill_logits(prompts)]))
            outputs.append(engine.generate(prompts, params))
        if dtype == "float32":
            assert outputs[0] == outputs[1]
            torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)
        else:
            span = float(logits[1].max() - logits[1].min())
            assert float((logits[0] - logits[1]).abs().max()) <= 0.02 * span
