"""Tensor parallelism on the CPU: two gloo ranks (this process is rank 0 and starts the other) against one process
and against transformers, for Llama, Qwen3 and Mamba-2 checkpoints saved by transformers; the split check before
anything starts; each rank reading only its slices; a follower's error, its death (before it reports, or
mid-generation) and Ctrl-C as rank 0 sees them; torchrun's variables that make no run; torchrun's launch of the
CLI.

The variants cover each split: Llama (biases on every projection: the row-parallel bias added after the
all-reduce; 2 KV heads, one per rank; an untied head), Qwen3 with one KV head (replicated on both ranks; q/k
norms; a tied head), Mamba-2 with one group (the gated norm over both ranks' channels, one all-reduce of the
squared sums) and with two (a group per rank).
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from fakes import cpu_capability
from lm_helpers import CheckpointFactory, headers_only

import infiniops_py
from infinilm import ConfigError, Engine, EngineOptions, SamplingParams
from infinilm.cli import main
from infinilm.distributed.launch import FollowerError
from infinilm.distributed.parallel import Shard, TensorParallel
from infinilm.engine.checks import cache_class, check_options
from infinilm.engine.gates import plan
from infinilm.engine.loader import load_weights
from infinilm.engine.memory import device_memory
from infinilm.models.registry import family_of, read_config

OPTIONS = {"block_size": 8, "num_blocks": 64, "max_model_len": 128}
STEPS = 8
PROMPTS = ([17, 3, 99, 150, 41, 8, 8, 120, 64, 5, 77], [100, 13, 13, 7, 91, 33, 2, 150, 46, 19, 18, 111, 60], [42, 7],
           [9])
VARIANTS = {
    "llama": ("llama", False, {}),
    "qwen3-1kv": ("qwen3", True, {"num_key_value_heads": 1}),
    "mamba2": ("mamba2", False, {}),
    "mamba2-2groups": ("mamba2", False, {"n_groups": 2}),
}


@dataclass
class Run:
    """One variant: its checkpoint, the transformers model, and the engines of one process and of two ranks."""

    path: Path
    hf: torch.nn.Module
    one: Engine
    two: Engine


@pytest.fixture(params=list(VARIANTS))
def run(checkpoint: CheckpointFactory, request: pytest.FixtureRequest) -> Iterator[Run]:
    """Variant `request.param`'s `Run`, its two-rank engine closed after the test (a process holds one
    tensor-parallel run at a time)."""
    family, tied, overrides = VARIANTS[request.param]
    path, hf = checkpoint(family, tied=tied, **overrides)
    one = Engine.from_pretrained(path, EngineOptions(**OPTIONS))  # one intra-op thread, as the started rank
    with Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=2)) as two:
        yield Run(path, hf, one, two)


def _hf_logits(hf: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0]


def _hf_greedy(hf: torch.nn.Module, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
                          pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_two_ranks_compute_the_logits_and_greedy_tokens_of_one_process_and_transformers(run: Run) -> None:
    """Prefill logits within fp32 rounding of one process's (the partial sums are added in another order) and
    within 1e-4 of transformers'; greedy tokens, with prompts joining running decodes, equal to both."""
    assert run.two.ranks is not None and run.two.ranks.layout == TensorParallel(2, 0)
    prompts = list(PROMPTS)
    two, one = run.two.prefill_logits(prompts), run.one.prefill_logits(prompts)
    for prompt, a, b in zip(prompts, two, one):
        assert a.shape == b.shape == (len(prompt), run.one.config.vocab_size)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a, _hf_logits(run.hf, prompt), rtol=0, atol=1e-4)
    assert run.two.cache.allocator.num_free == run.two.cache.allocator.num_blocks
    params = SamplingParams(max_new_tokens=STEPS, ignore_eos=True)
    seqs = [run.two.add_request(PROMPTS[0], params), run.two.add_request(PROMPTS[1], params)]
    for step in range(100):  # the later prompts join running decodes: mixed steps broadcast too
        if step in (2, 4):
            seqs.append(run.two.add_request(PROMPTS[len(seqs)], params))
        run.two.step()
        if not run.two.has_work():
            break
    ones = run.one.generate(list(PROMPTS), params)
    for prompt, seq, one in zip(PROMPTS, seqs, ones):
        assert seq.output == one == _hf_greedy(run.hf, prompt), f"prompt of {len(prompt)} tokens"


@pytest.mark.parametrize(("family", "message"), [
    ("llama", "tensor_parallel_size=3 cannot split this llama model across 3 ranks: num_attention_heads=4 is not "
              "a multiple of 3; num_key_value_heads=2 is not a multiple of 3 or a divisor of it (then replicated) "
              "(fix: a tensor_parallel_size in [1, 2, 4])"),
    ("mamba2", "tensor_parallel_size=3 cannot split this mamba2 model across 3 ranks: num_heads=4 is not a multiple "
               "of 3 (fix: a tensor_parallel_size in [1, 2, 4])"),
])
def test_a_model_that_does_not_split_is_refused_before_any_rank_starts_or_weight_is_read(
        checkpoint: CheckpointFactory, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        family: str, message: str) -> None:
    path, _ = checkpoint(family, tied=False)
    capsys.readouterr()  # a checkpoint made just now printed transformers' progress bar: not this test's output
    import safetensors

    def no_read(*args: object, **kwargs: object) -> None:
        pytest.fail("a safetensors file was opened")

    monkeypatch.setattr(safetensors, "safe_open", no_read)
    before = set(multiprocessing.active_children())  # the runs of the tests above may hold a rank still
    with pytest.raises(ConfigError) as err:
        Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=3))
    assert str(err.value) == message
    assert set(multiprocessing.active_children()) <= before
    assert main(["generate", "--model", str(path), "--prompt", "1 2 3", "--tensor-parallel-size", "3"]) == 2
    assert capsys.readouterr().err == f"infinilm generate: error: {message}\n"


def test_the_split_error_of_a_model_with_huge_head_counts_lists_the_working_sizes_up_to_128(
        checkpoint: CheckpointFactory, tmp_path: Path) -> None:
    """The sizes that would split were found by trying every size up to the head count: check of a config.json of
    2**58 heads (each tensor small enough to pass the size checks) never ended."""
    import json

    path, _ = checkpoint("qwen3", tied=False)
    huge = tmp_path / "huge"
    huge.mkdir()
    config = json.loads((path / "config.json").read_text())
    config |= {"num_attention_heads": 2**58, "num_key_value_heads": 1, "hidden_size": 2, "head_dim": 2,
               "intermediate_size": 2}
    (huge / "config.json").write_text(json.dumps(config))
    script = "import sys; from infinilm.cli import main; sys.exit(main(sys.argv[1:]))"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, "check", "--model", str(huge), "--tensor-parallel-size", "3",
                           *(f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items())],
                          capture_output=True, text=True, env=_subprocess_env(), timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr == (f"infinilm check: error: tensor_parallel_size=3 cannot split this qwen3 model across 3 "
                           f"ranks: num_attention_heads={2**58} is not a multiple of 3; intermediate_size=2 is not a "
                           "multiple of 3 (fix: a tensor_parallel_size in [1, 2]; those above 128 are not listed)\n")
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_a_given_cache_size_is_checked_against_the_memory_of_one_rank_s_heads(checkpoint: CheckpointFactory,
                                                                            family: str) -> None:
    """``num_blocks`` that one rank's cache (its KV heads, or its Mamba-2 heads' states) fits in memory is accepted,
    though the whole model's cache of as many blocks would not fit."""
    path, _ = checkpoint(family, tied=False)
    config = read_config(path)
    memory = device_memory(torch.device("cpu"))
    assert memory is not None
    small = {"block_size": 8, "max_model_len": 128}
    per_rank = cache_class(config).unit_bytes(TensorParallel(2).local_config(config), EngineOptions(**small))
    blocks = memory[1] // per_rank  # one rank's cache fits; the whole model's, twice the bytes, does not
    check_options(config, EngineOptions(**small, num_blocks=blocks, tensor_parallel_size=2))
    with pytest.raises(ConfigError, match=f"num_blocks={blocks}: the"):
        check_options(config, EngineOptions(**small, num_blocks=blocks))


@pytest.mark.parametrize(("variant", "op", "fields"), [
    ("llama", "reshape_and_cache_flash", {"num_kv_heads": 1}),  # 2 KV heads, one per rank
    ("qwen3-1kv", "flash_attn_with_kvcache", {"gqa_ratio": 2}),  # 4 query heads over 1 KV head: 2 per rank
    ("mamba2-2groups", "selective_state_update", {"n_groups": 1}),  # one group per rank
])
def test_the_gates_check_the_problems_of_one_rank_s_heads(checkpoint: CheckpointFactory, variant: str, op: str,
                                                          fields: dict[str, int]) -> None:
    """A split model's gates resolve the problems its ranks call: the heads, KV heads and groups of one rank."""
    family, tied, overrides = VARIANTS[variant]
    path, _ = checkpoint(family, tied=tied, **overrides)
    gate_plan = plan(read_config(path), EngineOptions(**OPTIONS, tensor_parallel_size=2))
    found = [p.fields for p in gate_plan.chosen if p.op == op]
    assert found and all(all(f[k] == v for k, v in fields.items()) for f in found), found


def test_check_gates_the_all_reduce_of_a_split_model_and_reads_no_weights(
        checkpoint: CheckpointFactory, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = checkpoint("llama", tied=False)
    headers_only(monkeypatch)
    before = set(multiprocessing.active_children())
    assert main(["check", "--model", str(path), "--tensor-parallel-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "\nall_reduce " in out and "torch.distributed.all_reduce" in out
    assert "backend=gloo, world_size=2" in out
    assert set(multiprocessing.active_children()) <= before  # a check starts no rank


def test_each_rank_reads_only_its_slices_of_the_sharded_tensors(checkpoint: CheckpointFactory,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2 of Llama, loaded in this process: every split tensor comes from ``get_slice`` (never a whole
    ``get_tensor``), and holds the rows (columns) of the second half."""
    path, hf = checkpoint("llama", tied=False)
    config = read_config(path)
    options = EngineOptions(**OPTIONS, tensor_parallel_size=2)
    rank1 = dataclasses.replace(plan(config, options), parallel=TensorParallel(2, 1))
    model = Engine._build(config, options, rank1, torch.device("cpu"))
    targets = model.targets()
    import safetensors

    real, whole = safetensors.safe_open, []

    class Recording:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.file = real(*args, **kwargs)

        def __enter__(self) -> Recording:
            self.st = self.file.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.__exit__(*exc)

        def keys(self) -> list[str]:
            return self.st.keys()

        def get_slice(self, name: str) -> object:
            return self.st.get_slice(name)

        def get_tensor(self, name: str) -> torch.Tensor:
            whole.append(name)
            return self.st.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    load_weights(path, targets, ignored=lambda n: family_of("llama").model.ignored(n, tied=False))
    assert whole and not [n for n in whole if isinstance(targets[n], Shard)]
    assert sorted(n for n, t in targets.items() if not isinstance(t, Shard)) == sorted(whole)
    state = hf.state_dict()
    layer = model.layers[0]
    attn = "model.layers.0.self_attn"
    q, k, v = state[f"{attn}.q_proj.weight"], state[f"{attn}.k_proj.weight"], state[f"{attn}.v_proj.weight"]
    assert torch.equal(layer.qkv_proj.weight, torch.cat([q[32:], k[16:], v[16:]]))  # q heads 2, 3 and KV head 1
    assert torch.equal(layer.o_proj.weight, state[f"{attn}.o_proj.weight"][:, 32:])
    assert torch.equal(layer.o_proj.bias, state[f"{attn}.o_proj.bias"])  # whole: added once after the sum
    assert torch.equal(layer.down_proj.weight, state["model.layers.0.mlp.down_proj.weight"][:, 48:])
    assert torch.equal(model.embed.weight, state["model.embed_tokens.weight"][128:])
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"][128:])


class _InProcess:
    """A provider registered in this process only (the ranks rank 0 starts do not see it): a gemm on the CPU."""

    @infiniops_py.hookimpl
    def infiniops_provider(self) -> infiniops_py.Provider:
        def gemm(a, b, c, bias, alpha, beta, trans_a, trans_b, out):  # type: ignore[no-untyped-def]
            return torch.matmul(a, b.t() if trans_b else b, out=out)

        impl = infiniops_py.Implementation("gemm", "inprocess", "inprocess.gemm", cpu_capability(), 5, gemm)
        return infiniops_py.Provider(name="inprocess", implementations=[impl])


def test_a_follower_s_error_is_raised_by_rank_0_and_no_rank_is_left(checkpoint: CheckpointFactory) -> None:
    """Rank 1 refuses the override of a provider only rank 0 has: rank 0 raises its error, and nothing is left
    running (no rank, no process group)."""
    path, _ = checkpoint("mamba2", tied=False)
    before = set(multiprocessing.active_children())
    infiniops_py.register_provider(_InProcess(), name="inprocess")
    try:
        with pytest.raises(FollowerError, match=r"tensor-parallel rank 1 failed: ConfigError: providers\[0\]="
                                                r"\('gemm', 'inprocess'\): no provider is named 'inprocess'"):
            Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=2,
                                                       providers=(("gemm", "inprocess"),)))
    finally:
        infiniops_py.unregister_provider("inprocess")
    assert set(multiprocessing.active_children()) <= before
    assert not torch.distributed.is_initialized()


class _ReportsAndExitsWhenAsked:
    """A follower's process that, at rank 0's first check of whether it is alive, has just sent its error and
    exited (exit code 1): a follower whose report and exit fall between rank 0's read of the pipe and that check
    (rank 0 descheduled there, on a loaded machine)."""

    def __init__(self, end: multiprocessing.connection.Connection) -> None:
        self.end, self.exitcode = end, None

    def is_alive(self) -> bool:
        if self.exitcode is None:
            self.end.send(("error", "ConfigError: the follower's own error"))
            self.end.close()
            self.exitcode = 1
        return False

    def join(self, timeout: float | None = None) -> None:
        pass


def test_an_error_sent_just_before_the_follower_exits_is_raised_not_a_silent_death() -> None:
    """Rank 0 raises what a follower reported, not that it died without a word, when the follower sent it and
    exited right after rank 0 last read its pipe: while waiting for a stage (`Ranks.loaded`) and when looking for
    the cause of a failed collective (`Ranks.failure`)."""
    from infinilm.distributed import launch

    failed = "tensor-parallel rank 1 failed: ConfigError: the follower's own error"
    mine, theirs = multiprocessing.Pipe()
    with pytest.raises(FollowerError, match=f"^{failed}$"):
        launch._wait(launch._Follower(1, _ReportsAndExitsWhenAsked(theirs), mine), "loaded")
    mine, theirs = multiprocessing.Pipe()
    assert launch._message(launch._Follower(1, _ReportsAndExitsWhenAsked(theirs), mine)) == failed


def _subprocess_env() -> dict[str, str]:
    """This process's environment for a child Python (its import path; one thread; no provider settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFINIOPS_", "TRITON_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    return env


_KILLED_WHILE_LOADING = """
import multiprocessing, os, signal, sys
import torch
import infinilm.engine.engine as engine_module
from infinilm import Engine, EngineOptions
from infinilm.distributed.launch import FollowerError

load = engine_module.load_weights

def kill_then_load(*args, **kwargs):  # rank 0's load: its follower, held in its own load, never reports 'loaded'
    for child in multiprocessing.active_children():
        os.kill(child.pid, signal.SIGKILL)
    return load(*args, **kwargs)

engine_module.load_weights = kill_then_load
try:
    Engine.from_pretrained(sys.argv[1], EngineOptions(block_size=8, num_blocks=64, max_model_len=128,
                                                      tensor_parallel_size=2))
except FollowerError as err:
    print(f"FollowerError: {err}")
print("left:", multiprocessing.active_children(), torch.distributed.is_initialized())
"""

# Imported by every Python process of the run (rank 0, the forkserver and, forked from it, the follower): rank 1's
# load waits until it is killed, so that it cannot report 'loaded' first (a follower quicker than rank 0 did, and
# then died at the cache's first collective instead: a different error, by timing).
_FOLLOWER_HELD_IN_LOAD = """
import os, time
import infinilm.engine.engine as engine_module

load = engine_module.load_weights

def held_on_rank_1(*args, **kwargs):
    while os.environ.get("RANK") == "1":
        time.sleep(1)
    return load(*args, **kwargs)

engine_module.load_weights = held_on_rank_1
"""


def test_a_follower_that_dies_without_a_word_is_raised_by_rank_0_with_its_signal(
        checkpoint: CheckpointFactory, tmp_path: Path) -> None:
    """A follower killed (SIGKILL) before it reports its weights loaded: rank 0 raises its death, with the signal,
    instead of waiting on a pipe that has closed (run in a child process: a wait that never ends fails the test by
    its timeout rather than hanging it)."""
    path, _ = checkpoint("llama", tied=False)
    (tmp_path / "sitecustomize.py").write_text(_FOLLOWER_HELD_IN_LOAD)
    env = _subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, "-c", _KILLED_WHILE_LOADING, str(path)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "FollowerError: tensor-parallel rank 1 died (exit code -9, killed by SIGKILL) before it reported 'loaded' "
        "without reporting an error", "left: [] False"], done.stdout


def test_a_follower_killed_mid_generation_ends_the_run_and_rank_0_raises_its_death(
        checkpoint: CheckpointFactory) -> None:
    """The step after a follower was killed raises its death (not the collective's connection error), ends the run
    (no rank, no process group left: another run can start in this process), and every later step raises it
    again."""
    path, _ = checkpoint("llama", tied=False)
    before = set(multiprocessing.active_children())
    engine = Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=2))
    try:
        (follower,) = set(multiprocessing.active_children()) - before
        engine.add_request(PROMPTS[0], SamplingParams(max_new_tokens=STEPS, ignore_eos=True))
        engine.step()
        engine.step()
        os.kill(follower.pid, signal.SIGKILL)
        died = r"tensor-parallel rank 1 died \(exit code -9, killed by SIGKILL\) during the run"
        with pytest.raises(FollowerError, match=f"^{died}"):
            engine.step()
        assert not torch.distributed.is_initialized()
        assert set(multiprocessing.active_children()) <= before
        with pytest.raises(FollowerError, match=f"^the tensor-parallel run has ended: {died}"):
            engine.step()
    finally:
        engine.close()
    with Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=2)) as again:
        assert again.generate([PROMPTS[3]], SamplingParams(max_new_tokens=2, ignore_eos=True))[0]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread ends by it
def test_a_server_whose_follower_died_stops_its_engine_thread_and_answers_503(checkpoint: CheckpointFactory) -> None:
    """``infinilm serve``'s engine thread: the request in flight when the follower died fails with its death (500),
    then the thread ends, so that ``/health`` answers 503 and a new request gets 503 naming the death, instead of a
    healthy server failing every request."""
    from infinilm.serve.engine_loop import EngineLoop
    from infinilm.serve.errors import APIError
    from infinilm.serve.metrics import ServerMetrics

    path, _ = checkpoint("mamba2", tied=False)
    before = set(multiprocessing.active_children())
    with Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=2)) as engine:
        (follower,) = set(multiprocessing.active_children()) - before
        os.kill(follower.pid, signal.SIGKILL)
        follower.join(30)

        async def serve() -> tuple[list[object], EngineLoop]:
            loop = EngineLoop(engine, ServerMetrics("state_row", engine.cache.allocator.num_blocks), max_waiting=4)
            loop.start()
            req = loop.submit(PROMPTS[0], SamplingParams(max_new_tokens=4, ignore_eos=True))
            events = [await asyncio.wait_for(req.events.get(), 60)]
            while not events[-1].final:
                events.append(await asyncio.wait_for(req.events.get(), 60))
            for _ in range(600):
                if not loop.alive:
                    break
                await asyncio.sleep(0.05)
            return events, loop

        events, loop = asyncio.run(serve())
    died = "tensor-parallel rank 1 died (exit code -9, killed by SIGKILL) during the run"
    error = events[-1].error
    assert error is not None and error.status == 500 and died in error.message
    assert not loop.alive and isinstance(loop.failure, FollowerError)  # /health: 503 "engine stopped"
    with pytest.raises(APIError) as refused:
        loop.submit(PROMPTS[1], SamplingParams(max_new_tokens=2))
    assert refused.value.status == 503 and died in refused.value.message


def test_a_closed_tensor_parallel_engine_refuses_a_step_naming_the_close(checkpoint: CheckpointFactory) -> None:
    """After `Engine.close` a step (or a prefill) is refused as such, not with torch's error about the destroyed
    process group."""
    path, _ = checkpoint("mamba2", tied=False)
    engine = Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=2))
    engine.close()
    closed = r"^the tensor-parallel run is closed \(Engine.close\): it runs no further step$"
    with pytest.raises(RuntimeError, match=closed):
        engine.prefill_logits([PROMPTS[3]])
    engine.add_request(PROMPTS[3], SamplingParams(max_new_tokens=2))
    with pytest.raises(RuntimeError, match=closed):
        engine.step()


def test_a_follower_ignores_ctrl_c_and_rank_0_decides_when_the_run_ends(checkpoint: CheckpointFactory) -> None:
    """SIGINT (a Ctrl-C at a terminal reaches every process of the group) leaves a follower running: the run still
    generates what one process does (``infinilm serve`` finishes its requests in flight on Ctrl-C)."""
    path, _ = checkpoint("mamba2", tied=False)
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    expected = Engine.from_pretrained(path, EngineOptions(**OPTIONS)).generate([PROMPTS[2]], params)
    before = set(multiprocessing.active_children())
    with Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=2)) as engine:
        (follower,) = set(multiprocessing.active_children()) - before
        os.kill(follower.pid, signal.SIGINT)
        time.sleep(0.5)  # a follower that took it as KeyboardInterrupt has exited by now
        assert follower.is_alive()
        assert engine.generate([PROMPTS[2]], params) == expected


def _split_engine_in_a_daemon(path: str, out: multiprocessing.SimpleQueue) -> None:  # type: ignore[type-arg]
    try:
        Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=2)).close()
        out.put("no error")
    except BaseException as err:
        out.put(f"{type(err).__name__}: {err}")


def test_a_daemonic_process_that_cannot_start_the_ranks_is_refused_naming_the_argument(
        checkpoint: CheckpointFactory) -> None:
    """A daemonic multiprocessing process (which multiprocessing lets start no child) is refused with a
    `ConfigError`, not multiprocessing's bare AssertionError."""
    path, _ = checkpoint("mamba2", tied=False)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.SimpleQueue()
    daemon = ctx.Process(target=_split_engine_in_a_daemon, args=(str(path), out), daemon=True)
    daemon.start()
    daemon.join(120)
    assert daemon.exitcode == 0 and not out.empty()
    assert out.get() == ("ConfigError: tensor_parallel_size=2: this process is a daemonic multiprocessing process, "
                         "which may not start the other ranks; run the engine in a process that is not daemonic, or "
                         "start every rank with torchrun")


@pytest.mark.parametrize(("rank", "port", "message"), [
    ("0", "free", r"RANK=0 and WORLD_SIZE=2 are set \(a torchrun launch\), but this rank could not join the others "
                  r"at MASTER_ADDR=127\.0\.0\.1, MASTER_PORT=\d+ within 2 s \(DistStoreError: Timed out after \d+ "
                  r"seconds waiting for clients\. 1/2 clients joined\.\): start all 2 ranks \(torchrun "
                  r"--nproc-per-node 2\) on a free MASTER_PORT, or unset RANK and WORLD_SIZE if an earlier torchrun "
                  r"left them set"),
    ("0", "taken", r"RANK=0 and WORLD_SIZE=2 are set .* \(DistNetworkError: .*address already in use\)"),
    ("2", "free", r"RANK=2, WORLD_SIZE=2, LOCAL_RANK=2: a launch needs 0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0"),
])
def test_torchrun_variables_that_make_no_run_are_refused_in_bounded_time(
        checkpoint: CheckpointFactory, rank: str, port: str, message: str) -> None:
    """``RANK`` and ``WORLD_SIZE`` left set (an earlier torchrun's) with nobody else coming, a ``MASTER_PORT``
    another process listens on, a rank outside the world: ``infinilm generate`` exits 2 with an error naming the
    variables, after at most `RENDEZVOUS_SECONDS` (2 here), before any weight is read."""
    path, _ = checkpoint("llama", tied=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if port == "free":
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                number = s.getsockname()[1]
        else:
            number = taken.getsockname()[1]
        env = {**_subprocess_env(), "RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(number)}
        script = ("import sys; import infinilm.distributed.launch as launch; launch.RENDEZVOUS_SECONDS = 2; "
                  "import infinilm.engine.engine as engine; engine.load_weights = lambda *a, **k: print('read'); "
                  "from infinilm.cli import main; sys.exit(main(sys.argv[1:]))")
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", script, "generate", "--model", str(path), "--prompt", "1 2", "--max-new-tokens",
             "2", "--tensor-parallel-size", "2", *(f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items())],
            capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert re.search(f"^infinilm generate: error: {message}", done.stderr, re.MULTILINE), done.stderr[-3000:]
    assert done.stdout == "" and time.monotonic() - start < 60  # no weight read ('read'), no token printed


def test_a_rendezvous_address_alone_in_the_environment_is_no_torchrun_launch(checkpoint: CheckpointFactory,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Schedulers set ``MASTER_ADDR``/``MASTER_PORT`` for every job: without ``RANK`` and ``WORLD_SIZE`` this process
    is still rank 0 of a run it starts itself (on its own port)."""
    path, _ = checkpoint("mamba2", tied=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # nothing listens there
    with Engine.from_pretrained(path, EngineOptions(**OPTIONS, tensor_parallel_size=2)) as engine:
        assert engine.ranks is not None and engine.ranks.layout == TensorParallel(2, 0)
        assert engine.generate([PROMPTS[3]], SamplingParams(max_new_tokens=2, ignore_eos=True))[0]


def test_torchrun_runs_the_cli_on_two_ranks(checkpoint: CheckpointFactory) -> None:
    """``torchrun --standalone --nproc-per-node 2 -m infinilm.cli generate --tensor-parallel-size 2``: rank 0
    prints the tokens one process generates; rank 1 follows and exits 0."""
    path, _ = checkpoint("llama", tied=False)
    one = Engine.from_pretrained(path, EngineOptions(**OPTIONS))
    expected = one.generate([PROMPTS[2]], SamplingParams(max_new_tokens=STEPS, ignore_eos=True))[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFINIOPS_", "TRITON_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
         "infinilm.cli", "generate", "--model", str(path), "--prompt", " ".join(map(str, PROMPTS[2])),
         "--max-new-tokens", str(STEPS), "--ignore-eos", "--tensor-parallel-size", "2",
         *(f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items())],
        capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(" ".join(map(str, expected)) + " \n["), done.stdout
