"""``infinilm serve``'s engine process (`infinilm.serve.engine_proc`, the default) against its engine thread
(``--no-engine-process``): the same tokens and logprobs, cancellation freeing the engine's blocks, the engine
process dying, and its startup error. Servers on the demo checkpoint, on the CPU; no test waits on a clock
but for generous deadlines of polls.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_serve import DENSE, Server, demo  # noqa: F401 - demo is a fixture

from infinilm.demo import PROMPT

pytest.importorskip("openai")

M = {"model": "m"}
LONG = ["--max-model-len", "1024", "--block-size", "16", "--num-blocks", "160", "--max-num-seqs", "4"]


def _pid(server: Server) -> int:
    """The engine process's pid, from the server's ready line."""
    line = server.ready
    found = re.search(r"engine on its own process \(pid (\d+)\)", line)
    assert found, line
    return int(found.group(1))


def _poll(what: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def servers(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:  # noqa: F811
    logs = tmp_path_factory.mktemp("logs")
    proc = Server(demo, *DENSE, log=logs / "process.err")
    try:
        thread = Server(demo, *DENSE, "--no-engine-process", log=logs / "thread.err")
        try:
            yield proc, thread
        finally:
            assert thread.stop() == 0, thread.log.read_text()
    finally:
        assert proc.stop() == 0, proc.log.read_text()


def _stream(server: Server, body: dict[str, object]) -> list[dict[str, object]]:
    with httpx.Client(base_url=server.url, timeout=60) as http, http.stream(
            "POST", "/v1/completions", json={**M, **body, "stream": True}) as resp:
        assert resp.status_code == 200
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_a_stream_through_the_engine_process_has_the_threads_tokens_and_logprobs(
        servers: tuple[Server, Server]) -> None:
    proc, thread = servers
    assert "engine on a thread" in thread.ready
    assert _pid(proc) != proc.proc.pid
    for body in ({"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True},
                 {"prompt": [5, 6, 7], "max_tokens": 24, "temperature": 0, "logprobs": 2}):
        got = [_stream(s, {**body, "return_token_ids": True}) for s in (proc, thread)]
        ids = [[t for c in g for t in c["choices"][0]["token_ids"]] for g in got]
        assert ids[0] == ids[1] and len(ids[0]) == body["max_tokens"]
        texts = ["".join(c["choices"][0]["text"] for c in g) for g in got]
        assert texts[0] == texts[1]
        assert got[0][-1]["choices"][0]["finish_reason"] == got[1][-1]["choices"][0]["finish_reason"] == "length"
        if "logprobs" in body:
            lps = [[lp for c in g for lp in c["choices"][0]["logprobs"]["token_logprobs"]] for g in got]
            assert lps[0] == pytest.approx(lps[1], abs=1e-4)


def test_a_cancelled_stream_frees_its_blocks_in_the_engine_process(servers: tuple[Server, Server]) -> None:
    proc, _ = servers
    before = proc.idle_metrics().get('infinilm_requests_finished_total{finish_reason="cancelled"}', 0.0)
    with httpx.Client(base_url=proc.url, timeout=60) as http, http.stream(
            "POST", "/v1/completions",
            json={**M, "prompt": [1], "max_tokens": 200, "ignore_eos": True, "stream": True}) as resp:
        lines = resp.iter_lines()
        assert next(lines).startswith("data: {")
        assert proc.metrics()['infinilm_cache_blocks_used{kind="kv_block"}'] > 0
    # the client is gone: the server cancels the request, the engine process frees its blocks and says so
    _poll("the cancelled request's blocks freed", lambda: proc.metrics()[
        'infinilm_requests_finished_total{finish_reason="cancelled"}'] == before + 1)
    m = proc.idle_metrics()
    assert m['infinilm_cache_blocks_used{kind="kv_block"}'] == 0 and m["infinilm_requests_running"] == 0


def test_the_engine_process_dying_fails_the_requests_in_flight_with_500_and_health_says_503(
        demo: Path, tmp_path: Path) -> None:  # noqa: F811
    server = Server(demo, *LONG, log=tmp_path / "err")
    try:
        long = {**M, "prompt": [1], "max_tokens": 1000, "ignore_eos": True}
        plain: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: plain.append(
            httpx.post(f"{server.url}/v1/completions", json=long, timeout=120)))
        with httpx.Client(base_url=server.url, timeout=120) as http, http.stream(
                "POST", "/v1/completions", json={**long, "stream": True}) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: {")
            waiter.start()
            _poll("both requests running", lambda: server.metrics()["infinilm_requests_running"] == 2)
            os.kill(_pid(server), signal.SIGKILL)
            events = [line[6:] for line in lines if line.startswith("data: ")]
        waiter.join(60)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_error" and "engine process ended (killed by SIGKILL)" in error["message"]
        assert plain[0].status_code == 500 and "SIGKILL" in plain[0].json()["error"]["message"]
        health = httpx.get(f"{server.url}/health", timeout=10)
        assert health.status_code == 503 and health.json() == {"status": "engine stopped"}
        again = httpx.post(f"{server.url}/v1/completions", json={**M, "prompt": [1], "max_tokens": 2}, timeout=10)
        assert again.status_code == 503 and "engine is not running" in again.json()["error"]["message"]
    finally:
        assert server.stop() == 0, server.log.read_text()
    assert "infinilm serve: the engine process ended (killed by SIGKILL)" in (tmp_path / "err").read_text()


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_an_engine_that_does_not_load_is_one_error_line_and_exit_status_2(
        demo: Path, tmp_path: Path, mode: str) -> None:  # noqa: F811
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((demo / "config.json").read_text())  # no weights
    extra = [] if mode == "process" else ["--no-engine-process"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFINIOPS_", "TRITON_"))} | {
        "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "infinilm.cli", "serve", "--model", str(bad), "--port", "0", *extra],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infinilm serve: error: "), out.stderr
    assert "Traceback" not in out.stderr and "on http://" not in out.stdout


def flaky_engine(path: str) -> object:
    """The demo engine whose step raises while a request of ``max_new_tokens=7`` runs (a module function: the
    engine process builds it by name)."""
    from infinilm import Engine, EngineOptions

    engine = Engine.from_pretrained(path, EngineOptions(max_num_seqs=4, max_model_len=256, num_blocks=64))
    step = engine.step

    def flaky() -> object:
        if any(s.params.max_new_tokens == 7 for s in engine.scheduler.running):
            raise RuntimeError("boom")
        return step()

    engine.step = flaky  # type: ignore[method-assign]
    return engine


@pytest.mark.parametrize("process", [True, False], ids=["process", "thread"])
def test_a_step_that_raises_fails_its_requests_with_500_a_refused_prompt_is_400_and_the_engine_goes_on(
        demo: Path, process: bool) -> None:  # noqa: F811
    import asyncio
    import functools

    from infinilm import SamplingParams
    from infinilm.serve.server import start_engine

    client, facts = start_engine(functools.partial(flaky_engine, str(demo)), process=process, max_waiting=8)
    assert facts["max_model_len"] == 256 and facts["cache_kind"] == "kv_block"

    async def events(req: object) -> list[object]:
        out = [await asyncio.wait_for(req.events.get(), 60)]  # type: ignore[attr-defined]
        while not out[-1].final:
            out.append(await asyncio.wait_for(req.events.get(), 60))  # type: ignore[attr-defined]
        return out

    async def run() -> tuple[list[object], ...]:
        client.start()
        try:
            failed = await events(client.submit([1, 2, 3], SamplingParams(max_new_tokens=7)))
            refused = await events(client.submit(list(range(1, 300)), SamplingParams(max_new_tokens=2)))
            ok = await events(client.submit([1, 2, 3], SamplingParams(max_new_tokens=3, ignore_eos=True)))
            return failed, refused, ok
        finally:
            await client.stop()

    failed, refused, ok = asyncio.run(run())
    assert failed[-1].error.status == 500 and "RuntimeError: boom" in failed[-1].error.message
    assert len(refused) == 1 and refused[0].error.status == 400 and refused[0].error.param == "prompt"
    assert [e.token is not None for e in ok] == [False, True, True, True] and ok[-1].finish_reason == "length"
    rendered = client.metrics.render().decode()
    assert 'infinilm_cache_blocks_used{kind="kv_block"} 0.0' in rendered
    assert 'infinilm_requests_finished_total{finish_reason="error"} 1.0' in rendered
    assert not client.alive


def test_a_gate_error_in_the_engine_process_is_the_threads_report_and_exit_status_1(demo: Path) -> None:  # noqa: F811
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFINIOPS_", "TRITON_"))} | {
        "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "infinilm.cli", "serve", "--model", str(demo), "--port", "0", "--dtype", "float16",
           "--provider", "rms_norm=triton"]  # triton serves CUDA only: no provider for this CPU run
    outs = [subprocess.run(cmd + extra, capture_output=True, text=True, timeout=120, env=env)
            for extra in ([], ["--no-engine-process"])]
    assert [o.returncode for o in outs] == [1, 1], outs[0].stderr
    assert outs[0].stderr == outs[1].stderr and outs[0].stderr.startswith("gate check failed")
    assert "no provider can serve rms_norm" in outs[0].stderr and "Traceback" not in outs[0].stderr


def _engine_child(parent: int) -> int | None:
    """The pid of `parent`'s engine process (multiprocessing's spawned child, not its resource tracker), if any."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in cmdline:
                return int(entry.name)
    return None


def _running(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_while_the_engine_process_loads_ends_it_too() -> None:
    # a server stopped while its engine still loads (minutes for a large checkpoint, GPU memory held) must not
    # leave the engine process loading on its own: it ends with the server, which ends as SIGTERM ends it
    code = ("import functools, time\n"
            "from infinilm.serve.engine_proc import start_engine_process\n"
            "start_engine_process(functools.partial(time.sleep, 600), max_waiting=1)\n")  # an engine that never loads
    server = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"})
    child = None
    try:
        _poll("the engine process spawned", lambda: _engine_child(server.pid) is not None, timeout=60)
        child = _engine_child(server.pid)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == -signal.SIGTERM
        _poll("the engine process ended with the server", lambda: not _running(child))  # type: ignore[arg-type]
    finally:
        server.kill()
        server.wait()
        if child is not None and _running(child):
            os.kill(child, signal.SIGKILL)
