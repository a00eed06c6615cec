"""``infinilm serve`` end to end: the real server in its own process on a free loopback port, driven by the
`openai` client (completions and chat, streaming and not) and by `httpx` (raw and malformed requests).

Checkpoints: the demo Qwen3 (taught one sentence, byte-level tokenizer; a chat template is written into its
folder) and a tiny Mamba-2 without a tokenizer. Every server is stopped by SIGTERM at the end of its fixture
or test and must exit 0. Bounded: the soak sends 500 requests of at most 8 tokens (cancelled ones ask for 64
and disconnect after 1-2 chunks), 32 at a time.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
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
from prometheus_client.parser import text_string_to_metric_families
from test_mamba2 import hf_mamba2

from infinilm import Engine, EngineOptions, SamplingParams
from infinilm.cli import main
from infinilm.demo import PROMPT, TEXT, demo_checkpoint
from infinilm.serve.errors import APIError
from infinilm.serve.metrics import ServerMetrics
from infinilm.serve.schemas import ModelInfo, parse_chat, parse_completion
from infinilm.serve.text import TextOutput
from infinilm.tokenizer import load_tokenizer

# installed by the test extra (CI); the GPU machine, which collects this module for `-m gpu`, lacks it
openai = pytest.importorskip("openai")

MAX_LEN = 256
DENSE = ["--max-model-len", str(MAX_LEN), "--block-size", "16", "--num-blocks", "64", "--max-num-seqs", "16"]
MAMBA = ["--max-model-len", str(MAX_LEN), "--num-blocks", "8", "--max-num-seqs", "8"]
# renders only the user turns: [system, user "InfiniOps"] becomes the prompt "InfiniOps"
TEMPLATE = "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
START_TIMEOUT = 120.0


class Server:
    """``infinilm serve`` in a subprocess on ``127.0.0.1``, port 0 (the server prints the one it got)."""

    def __init__(self, model: Path, *args: str, log: Path, env: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("INFINIOPS_", "TRITON_", "INFINILM_API"))
               } | (env or {})
        env |= {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infinilm.cli", "serve", "--model", str(model), "--host", "127.0.0.1",
                 "--port", "0", "--served-model-name", "m", *args],
                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        watchdog = threading.Timer(START_TIMEOUT, self.proc.kill)  # a server that never starts fails the test
        watchdog.start()
        found = None
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if found := re.search(r"^infinilm serve: .* on (http://127\.0\.0\.1:\d+)", line):
                self.ready = line  # the ready line
                break
        watchdog.cancel()
        if not found:
            self.proc.kill()
            raise RuntimeError(f"the server did not start:\n{log.read_text()}")
        self.url = found.group(1)

    def client(self) -> object:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=60)

    def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics``: ``name{label="v"}`` -> value."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def idle_metrics(self, timeout: float = 10.0) -> dict[str, float]:
        """The metrics once nothing runs or waits (the engine thread publishes after its last step)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m["infinilm_requests_running"] == m["infinilm_requests_waiting"] == 0 or time.monotonic() > deadline:
                return m
            time.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the exit status (the process is killed, and the test fails, past `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the server did not exit within {timeout}s of SIGTERM") from None


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = demo_checkpoint(tmp_path_factory.mktemp("serve-demo"))
    config = {"chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def mamba(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("serve-mamba2")
    hf_mamba2(seed=3).save_pretrained(str(path))
    return path


def _server(model: Path, args: list[str], log: Path) -> Iterator[Server]:
    server = Server(model, *args, log=log)
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log.read_text()


@pytest.fixture(scope="module")
def dense_server(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _server(demo, DENSE, tmp_path_factory.mktemp("logs") / "dense.err")


@pytest.fixture(scope="module")
def mamba_server(mamba: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _server(mamba, MAMBA, tmp_path_factory.mktemp("logs") / "mamba.err")


@pytest.fixture(scope="module")
def dense_async_server(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The dense server with async scheduling on (off by default on the CPU): `infinilm.engine.overlap`."""
    yield from _server(demo, [*DENSE, "--async-scheduling"], tmp_path_factory.mktemp("logs") / "dense-async.err")


def _generate_cli(model: Path, prompt: str, max_new_tokens: int, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``infinilm generate`` prints as the generated text (greedy)."""
    capsys.readouterr()
    assert main(["generate", "--model", str(model), "--prompt", prompt, "--max-new-tokens", str(max_new_tokens),
                 "--max-model-len", str(MAX_LEN)]) == 0
    return capsys.readouterr().out.rsplit("\n[", 1)[0]


def test_greedy_completions_and_chat_streamed_or_not_equal_infinilm_generate(
    dense_server: Server, demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = _generate_cli(demo, PROMPT, 200, capsys)
    assert expected == TEXT.removeprefix(PROMPT)  # the demo model ends its sentence with EOS
    client = dense_server.client()
    full = client.completions.create(model="m", prompt=PROMPT, max_tokens=200, temperature=0)
    assert full.choices[0].text == expected and full.choices[0].finish_reason == "stop"
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (len(PROMPT), len(expected) + 1)  # + EOS
    chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=200, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    *tokens, usage = chunks
    assert len(tokens) == len(expected) + 1  # one chunk per token, the EOS's text is ""
    assert "".join(c.choices[0].text for c in tokens) == expected
    assert [c.choices[0].finish_reason for c in tokens] == [None] * (len(tokens) - 1) + ["stop"]
    assert usage.choices == [] and usage.usage.completion_tokens == len(tokens)
    short = client.completions.create(model="m", prompt=PROMPT, max_tokens=7, temperature=0)
    assert short.choices[0].text == expected[:7] and short.choices[0].finish_reason == "length"

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model="m", messages=messages, max_tokens=200, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content == expected
    assert chat.choices[0].finish_reason == "stop" and chat.usage.prompt_tokens == len(PROMPT)
    stream = list(client.chat.completions.create(model="m", messages=messages, max_tokens=200, temperature=0,
                                                 stream=True))
    assert stream[0].choices[0].delta.role == "assistant" and len(stream) == 1 + len(expected) + 1
    assert "".join(c.choices[0].delta.content or "" for c in stream) == expected
    assert stream[-1].choices[0].finish_reason == "stop"
    models = client.models.list().data
    assert [m.id for m in models] == ["m"]


def test_stop_strings_and_stop_tokens_end_the_output_with_finish_reason_stop(dense_server: Server) -> None:
    client = dense_server.client()
    # "-Py runs this model through a capability resolver": stop strings found across token boundaries
    out = client.completions.create(model="m", prompt=PROMPT, max_tokens=60, temperature=0, stop=["xyz", "model thr"])
    assert out.choices[0].text == "-Py runs this " and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == len("-Py runs this model thr")  # tokens up to the one completing it
    chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=60, temperature=0, stream=True,
                                            stop="runs"))
    assert "".join(c.choices[0].text for c in chunks) == "-Py " and chunks[-1].choices[0].finish_reason == "stop"
    # "-Py" then " " (byte 32): a stop token ends the output with it
    ids = client.completions.create(model="m", prompt=PROMPT, max_tokens=60, temperature=0,
                                    extra_body={"stop_token_ids": [32], "return_token_ids": True})
    assert ids.choices[0].text == "-Py " and ids.choices[0].finish_reason == "stop"
    assert ids.model_extra["prompt_token_ids"] == list(PROMPT.encode())


def test_async_scheduling_streams_the_same_tokens_and_stops_at_the_same_strings(
    dense_async_server: Server, demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the async server's token after a stop string (or the last one) is computed, then dropped: never streamed
    test_greedy_completions_and_chat_streamed_or_not_equal_infinilm_generate(dense_async_server, demo, capsys)
    test_stop_strings_and_stop_tokens_end_the_output_with_finish_reason_stop(dense_async_server)
    test_32_concurrent_streaming_clients_each_get_their_solo_output(dense_async_server, demo)


def _solo(model: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    engine = Engine.from_pretrained(model, EngineOptions(max_model_len=MAX_LEN, block_size=16, num_blocks=64))
    return [engine.generate([p], SamplingParams(max_new_tokens=max_tokens, ignore_eos=True))[0] for p in prompts]


def test_32_concurrent_streaming_clients_each_get_their_solo_output(dense_server: Server, demo: Path) -> None:
    prompts = [list(TEXT[:n].encode()) for n in range(3, 35)]
    expected = _solo(demo, prompts, 12)

    async def one(client: object, prompt: list[int]) -> list[int]:
        stream = await client.completions.create(  # type: ignore[attr-defined]
            model="m", prompt=prompt, max_tokens=12, temperature=0, stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True})
        return [t async for c in stream for t in c.choices[0].token_ids]

    async def run() -> list[list[int]]:
        async with openai.AsyncOpenAI(base_url=f"{dense_server.url}/v1", api_key="none", max_retries=0) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    assert asyncio.run(run()) == expected
    assert dense_server.idle_metrics()['infinilm_cache_blocks_used{kind="kv_block"}'] == 0


async def _soak(url: str, vocab: int, n: int, concurrency: int, seed: int) -> dict[str, object]:
    """`n` streaming requests, `concurrency` at a time; a random third disconnects after 1-2 chunks."""
    rng = random.Random(seed)
    jobs = [([rng.randrange(vocab) for _ in range(rng.randint(1, 12))], rng.randint(4, 8), rng.random() < 1 / 3)
            for _ in range(n)]
    gate = asyncio.Semaphore(concurrency)
    done: list[int] = []
    cancelled = 0

    async def one(client: object, prompt: list[int], max_tokens: int, cancel: bool) -> None:
        nonlocal cancelled
        async with gate:
            stream = await client.completions.create(  # type: ignore[attr-defined]
                model="m", prompt=prompt, max_tokens=64 if cancel else max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            if cancel:
                keep = rng.randint(1, 2)
                async for _ in stream:
                    keep -= 1
                    if not keep:
                        break
                await stream.close()  # the connection closes mid-stream: the server cancels the request
                cancelled += 1
                return
            chunks = [c async for c in stream]
            *tokens, usage = chunks
            assert len(tokens) == max_tokens == usage.usage.completion_tokens
            assert tokens[-1].choices[0].finish_reason == "length"
            done.append(max_tokens)

    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60) as client:
        await asyncio.gather(*(one(client, *job) for job in jobs))
    return {"completed": done, "cancelled": cancelled, "prompt_tokens": sum(len(p) for p, _, _ in jobs)}


@pytest.mark.parametrize("which", ["dense", "mamba", "dense_async"])
def test_soak_of_500_requests_with_a_third_cancelled_frees_every_block_and_keeps_metrics_consistent(
    which: str, request: pytest.FixtureRequest
) -> None:
    server: Server = request.getfixturevalue(f"{which}_server")
    kind = "kv_block" if which.startswith("dense") else "state_row"
    before = server.idle_metrics()
    start = time.perf_counter()
    result = asyncio.run(_soak(server.url, 257 if which.startswith("dense") else 160, 500, 32, seed=7))
    elapsed = time.perf_counter() - start
    after = server.idle_metrics()
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    completed, cancelled = result["completed"], result["cancelled"]
    assert len(completed) + cancelled == 500 and 120 <= cancelled <= 220  # type: ignore[arg-type]
    assert after[f'infinilm_cache_blocks_used{{kind="{kind}"}}'] == 0  # every block (state row) is free
    assert after["infinilm_requests_running"] == after["infinilm_requests_waiting"] == 0
    finished = {r: delta.get(f'infinilm_requests_finished_total{{finish_reason="{r}"}}', 0.0)
                for r in ("stop", "length", "cancelled", "abort", "error")}
    assert finished["stop"] == finished["abort"] == finished["error"] == 0
    assert finished["length"] + finished["cancelled"] == 500
    assert finished["cancelled"] >= 0.9 * cancelled  # 64 tokens asked: the disconnect lands before the end
    assert delta["infinilm_prompt_tokens_total"] == result["prompt_tokens"]
    tokens = delta["infinilm_generation_tokens_total"]
    assert tokens >= sum(completed) + cancelled  # type: ignore[arg-type]
    assert tokens < sum(completed) + 0.5 * 64 * cancelled  # type: ignore[arg-type] # cancelled early, not at 64
    assert delta["infinilm_time_to_first_token_seconds_count"] == 500
    assert delta["infinilm_inter_token_latency_seconds_count"] == tokens - 500
    assert delta["infinilm_e2e_request_latency_seconds_count"] == 500
    assert elapsed < 90, f"the soak took {elapsed:.1f}s"


def test_a_scrape_while_a_step_sets_the_state_gauges_sees_them_all_before_or_all_after() -> None:
    """``/metrics`` read while the engine thread sets a step's gauges (running, waiting, cache used) shows the
    step before or this one, never a mix: a scrape that read 0 running and 0 waiting with the last request's
    blocks still counted took the server for idle with a block held."""
    metrics = ServerMetrics("kv_block", 8)
    metrics.set_state(1, 0, 3)
    inside, release = threading.Event(), threading.Event()
    real = metrics.waiting.set

    def held(value: float) -> None:  # the engine thread, descheduled between two of the gauges
        real(value)
        inside.set()
        release.wait(30)

    metrics.waiting.set = held  # type: ignore[method-assign]
    setter = threading.Thread(target=metrics.set_state, args=(0, 0, 0))
    setter.start()
    assert inside.wait(30)
    rendered: list[bytes] = []
    reader = threading.Thread(target=lambda: rendered.append(metrics.render()))
    reader.start()
    reader.join(0.5)  # a scrape that does not wait for the step's gauges has read them by now
    release.set()
    setter.join(30)
    reader.join(30)
    samples = {s.name: s.value for f in text_string_to_metric_families(rendered[0].decode()) for s in f.samples}
    state = tuple(samples[f"infinilm_{name}"] for name in ("requests_running", "requests_waiting",
                                                           "cache_blocks_used"))
    assert state in ((1, 0, 3), (0, 0, 0)), state


def test_bench_serve_reports_throughput_and_latency_percentiles(dense_server: Server,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench-serve", "--base-url", dense_server.url, "--num-prompts", "12", "--concurrency", "4",
            "--input-len", "8", "--output-len", "5"]
    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completed"] == 12 and report["failed"] == 0
    assert report["output_throughput"] == pytest.approx(12 * 5 / report["duration_s"], rel=1e-6)
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        stats = report[key]
        assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"], (key, stats)
    assert main([*args, "--request-rate", "50"]) == 0
    table = capsys.readouterr().out
    assert re.search(r"requests completed / failed +12 / 0\n", table) and "4 / 50 req/s" in table
    assert re.search(r"TTFT mean / p50 / p90 / p99 \(ms\) +[\d.]+ / [\d.]+ / [\d.]+ / [\d.]+\n", table)
    assert main(["bench-serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"]) == 2
    assert "--base-url http://127.0.0.1:9" in capsys.readouterr().err


def test_bench_serve_sends_its_sampling_options(dense_server: Server, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``--temperature 0.8 --top-p 0.9 --top-k 50`` (vLLM's bench options) reach every request's body (the
    warm-up's too) and the server serves them; without them the requests are greedy."""
    from infinilm.serve import bench_client

    sent: list[dict[str, object]] = []
    real = bench_client._one

    async def spy(session: object, url: str, payload: dict[str, object]) -> object:
        sent.append(payload)
        return await real(session, url, payload)  # type: ignore[arg-type]

    monkeypatch.setattr(bench_client, "_one", spy)
    args = ["bench-serve", "--base-url", dense_server.url, "--num-prompts", "4", "--concurrency", "2",
            "--input-len", "8", "--output-len", "3", "--json"]
    capsys.readouterr()
    assert main([*args, "--temperature", "0.8", "--top-p", "0.9", "--top-k", "50"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 4
    assert len(sent) == 5 and all((p["temperature"], p["top_p"], p["top_k"]) == (0.8, 0.9, 50) for p in sent)
    sent.clear()
    assert main(args) == 0  # the default: greedy, no top_p / top_k sent
    assert all(p["temperature"] == 0 and "top_p" not in p and "top_k" not in p for p in sent)


M = {"model": "m"}
HOSTILE: list[tuple[object, int, str | None]] = [  # (body: a dict sent as JSON, or raw bytes), status, param
    (b"{not json", 400, "body"),
    (b"\xff\xfe", 400, "body"),
    (b"[1, 2]", 400, "body"),
    (b'"a string"', 400, "body"),
    (b'{"model": "m", "prompt": "x", "temperature": NaN}', 400, "body"),
    (b'{"model": "m", "prompt": "x", "max_tokens": Infinity}', 400, "body"),
    (b"", 400, "body"),
    ({"prompt": "x"}, 400, "model"),
    ({"model": 7, "prompt": "x"}, 400, "model"),
    ({"model": "other", "prompt": "x"}, 404, "model"),
    ({**M}, 400, "prompt"),
    ({**M, "prompt": ""}, 400, "prompt"),
    ({**M, "prompt": []}, 400, "prompt"),
    ({**M, "prompt": [1, 300]}, 400, "prompt"),
    ({**M, "prompt": [-1]}, 400, "prompt"),
    ({**M, "prompt": [1.5]}, 400, "prompt"),
    ({**M, "prompt": [True]}, 400, "prompt"),
    ({**M, "prompt": ["a", [1]]}, 400, "prompt"),  # a batch of texts and token ids mixed
    ({**M, "prompt": [[1], []]}, 400, "prompt"),  # an empty prompt in a batch
    ({**M, "prompt": [[1], [1.5]]}, 400, "prompt"),
    ({**M, "prompt": {"text": "x"}}, 400, "prompt"),
    ({**M, "prompt": [1] * MAX_LEN}, 400, "prompt"),
    ({**M, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({**M, "prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ({**M, "prompt": "x", "max_tokens": MAX_LEN}, 400, "max_tokens"),
    ({**M, "prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),
    ({**M, "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ({**M, "prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ({**M, "prompt": "x", "temperature": -0.1}, 400, "temperature"),
    ({**M, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({**M, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({**M, "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({**M, "prompt": "x", "top_k": -2}, 400, "top_k"),
    ({**M, "prompt": "x", "top_k": 1.5}, 400, "top_k"),
    ({**M, "prompt": "x", "seed": "x"}, 400, "seed"),
    ({**M, "prompt": "x", "seed": 2**70}, 400, "seed"),
    ({**M, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({**M, "prompt": "x", "stop": [1]}, 400, "stop"),
    ({**M, "prompt": "x", "stop": ""}, 400, "stop"),
    ({**M, "prompt": "x", "stop_token_ids": [999]}, 400, "stop_token_ids"),
    ({**M, "prompt": "x", "stop_token_ids": 5}, 400, "stop_token_ids"),
    ({**M, "prompt": "x", "ignore_eos": "yes"}, 400, "ignore_eos"),
    ({**M, "prompt": "x", "stream": "true"}, 400, "stream"),
    ({**M, "prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({**M, "prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}, 400,
     "stream_options.include_usage"),
    ({**M, "prompt": "x", "n": 0}, 400, "n"),
    ({**M, "prompt": "x", "n": 1000}, 400, "n"),  # more choices than may ever wait (--max-waiting)
    ({**M, "prompt": "x", "best_of": 3}, 400, "best_of"),
    ({**M, "prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({**M, "prompt": "x", "logprobs": True}, 400, "logprobs"),
    ({**M, "prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ({**M, "prompt": "x", "frequency_penalty": "x"}, 400, "frequency_penalty"),
    ({**M, "prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({**M, "prompt": "x", "min_p": 1.5}, 400, "min_p"),
    ({**M, "prompt": "x", "echo": True}, 400, "echo"),
    ({**M, "prompt": "x", "response_format": {"type": "json_object"}}, 400, "response_format"),
    ({**M, "prompt": "x", "response_format": {"type": "yaml"}}, 400, "response_format.type"),
    ({**M, "prompt": "x", "max_token": 5}, 400, "max_token"),
    ({**M, "prompt": "x", "user": 5}, 400, "user"),
    ({**M, "messages": []}, 400, "messages"),  # to the completions route: an unknown field
]
HOSTILE_CHAT: list[tuple[object, int, str | None]] = [
    ({**M}, 400, "messages"),
    ({**M, "messages": []}, 400, "messages"),
    ({**M, "messages": "hi"}, 400, "messages"),
    ({**M, "messages": ["hi"]}, 400, "messages[0]"),
    ({**M, "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
    ({**M, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ({**M, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, 400,
     "messages[0].content[0]"),
    ({**M, "messages": [{"role": "user", "content": "hi", "tool_calls": []}]}, 400, "messages[0].tool_calls"),
    ({**M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "max_completion_tokens": 5}, 400,
     "max_completion_tokens"),
    ({**M, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ({**M, "messages": [{"role": "user", "content": "x" * MAX_LEN}]}, 400, "messages"),
    ({**M, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400, "tools"),
    ({**M, "prompt": "hi"}, 400, "prompt"),
    ({**M, "messages": [{"role": "user", "content": "hi"}], "logprobs": 3}, 400, "logprobs"),
    ({**M, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ({**M, "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs"),
    ({**M, "messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, 400, "response_format"),
]


def test_hostile_requests_get_4xx_naming_the_field_and_the_server_keeps_serving(dense_server: Server) -> None:
    assert len(HOSTILE) + len(HOSTILE_CHAT) >= 30
    with httpx.Client(base_url=dense_server.url, timeout=30) as http:
        # a long request streams while the hostile ones arrive: none of them may disturb it
        with http.stream("POST", "/v1/completions", json={**M, "prompt": PROMPT, "max_tokens": 150,
                                                          "temperature": 0, "stream": True}) as running:
            for route, table in (("/v1/completions", HOSTILE), ("/v1/chat/completions", HOSTILE_CHAT)):
                for body, status, param in table:
                    resp = (http.post(route, content=body) if isinstance(body, bytes)
                            else http.post(route, json=body))
                    assert resp.status_code == status, (route, body, resp.text)
                    error = resp.json()["error"]
                    assert error["param"] == param and error["message"], (route, body, error)
                    assert error["type"] == "invalid_request_error"
            text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in running.iter_lines()
                           if line.startswith("data: {"))
        assert text == TEXT.removeprefix(PROMPT)[:150]
        for method, path, status in (("GET", "/v1/completions", 405), ("POST", "/v1/nothing", 404),
                                     ("POST", "/v1/models", 405)):
            resp = http.request(method, path, json=M)
            assert resp.status_code == status and "error" in resp.json(), (method, path, resp.text)
        too_big = http.post("/v1/completions", content=b" " * (2 << 20))
        assert too_big.status_code == 413 and too_big.json()["error"]["param"] == "body"
        assert http.get("/health").json() == {"status": "ok"}
        again = http.post("/v1/completions", json={**M, "prompt": PROMPT, "max_tokens": 3, "temperature": 0})
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == "-Py"


def _error_of(resp: httpx.Response) -> tuple[int, str | None]:
    """The status and the ``param`` of an OpenAI error answer (an error body is JSON, whatever went wrong)."""
    assert resp.headers["Content-Type"].startswith("application/json"), (resp.status_code, resp.text)
    return resp.status_code, resp.json()["error"]["param"]


def _internal_errors(server: Server) -> float:
    return server.metrics().get('infinilm_requests_rejected_total{status="500"}', 0.0)


def test_values_the_engine_would_refuse_are_a_400_naming_the_field(dense_server: Server, demo: Path) -> None:
    # validation must refuse whatever SamplingParams, the engine or the chat path would: a negative seed
    # (SamplingParams takes [0, 2**64)), a chat that renders to no tokens, text that encodes to an id the
    # model's embedding does not have (a tokenizer may hold more ids than the config's vocab_size)
    before = _internal_errors(dense_server)
    with httpx.Client(base_url=dense_server.url, timeout=30) as http:
        for seed in (-1, -(2**63)):
            resp = http.post("/v1/completions", json={**M, "prompt": PROMPT, "max_tokens": 2, "seed": seed})
            assert _error_of(resp) == (400, "seed"), resp.text
        for messages in ([{"role": "system", "content": "x"}], [{"role": "user", "content": ""}]):
            resp = http.post("/v1/chat/completions", json={**M, "messages": messages})  # TEMPLATE renders ""
            assert _error_of(resp) == (400, "messages"), resp.text
        ok = http.post("/v1/completions", json={**M, "prompt": PROMPT, "max_tokens": 2, "seed": 2**64 - 1})
        assert ok.status_code == 200, ok.text
    assert _internal_errors(dense_server) == before
    tokenizer = load_tokenizer(demo)
    tokenizer.add_special_tokens(["<|pad|>"])  # id 257: one past the model's vocab_size
    info = ModelInfo("m", 257, MAX_LEN, 16, 64, tokenizer, lambda messages: messages[-1]["content"])
    with pytest.raises(APIError) as text:
        parse_completion({**M, "prompt": "In<|pad|>"}, info)
    with pytest.raises(APIError) as chat:
        parse_chat({**M, "messages": [{"role": "user", "content": "In<|pad|>"}]}, info)
    assert (text.value.status, text.value.param, chat.value.status, chat.value.param) == (400, "prompt", 400,
                                                                                          "messages")
    assert "257" in text.value.message and "vocab" in chat.value.message


def test_integers_too_large_for_a_float_are_a_400_naming_the_field(dense_server: Server) -> None:
    before = _internal_errors(dense_server)
    with httpx.Client(base_url=dense_server.url, timeout=30) as http:
        for field in ("temperature", "top_p"):
            body = b'{"model": "m", "prompt": "In", "%s": 1%s}' % (field.encode(), b"0" * 400)
            assert _error_of(http.post("/v1/completions", content=body)) == (400, field)
    assert _internal_errors(dense_server) == before


def test_unpaired_surrogates_anywhere_in_the_body_are_a_400_naming_the_field(dense_server: Server) -> None:
    # JSON may escape a lone surrogate (\ud800), which no UTF-8 text (the tokenizer's, the response's) can hold
    cases = [
        ("/v1/completions", r'{"model": "m", "prompt": "In\ud800"}', "prompt"),
        ("/v1/completions", r'{"model": "m", "prompt": "In", "stop": ["x", "\udfff"]}', "stop[1]"),
        ("/v1/completions", r'{"model": "m", "prompt": "In", "user": "\ud83d"}', "user"),
        ("/v1/completions", r'{"model": "m", "prompt": "In", "\ud800": 1}', "body"),
        ("/v1/chat/completions", r'{"model": "m", "messages": [{"role": "user", "content": "\udc00"}]}',
         "messages[0].content"),
        ("/v1/chat/completions", r'{"model": "m", "messages": [{"role": "user", "content": "hi", "\ud800": 1}]}',
         "messages[0]"),
    ]
    before = _internal_errors(dense_server)
    with httpx.Client(base_url=dense_server.url, timeout=30) as http:
        for route, body, param in cases:
            resp = http.post(route, content=body.encode())
            assert _error_of(resp) == (400, param), (body, resp.text)
            assert "surrogate" in resp.json()["error"]["message"]
        pair = http.post("/v1/completions", content=rb'{"model": "m", "prompt": "In\ud83d\ude00", "max_tokens": 2}')
        assert pair.status_code == 200, pair.text  # a surrogate pair is one character: served
    assert _internal_errors(dense_server) == before


def test_a_body_that_cannot_be_decompressed_is_a_400_naming_the_body(dense_server: Server) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    before = _internal_errors(dense_server)
    with httpx.Client(base_url=dense_server.url, timeout=30) as http:
        bad = http.post("/v1/completions", content=b"not gzip at all", headers=headers)
        assert _error_of(bad) == (400, "body") and "gzip" in bad.json()["error"]["message"], bad.text
        # the server drops a connection whose body it could not read: the answer says so, and the client's next
        # request goes on a new connection instead of being reset on the old one
        assert bad.headers.get("connection") == "close", bad.headers
        body = json.dumps({**M, "prompt": PROMPT, "max_tokens": 3, "temperature": 0}).encode()
        good = http.post("/v1/completions", content=gzip.compress(body), headers=headers)
        assert good.status_code == 200 and good.json()["choices"][0]["text"] == "-Py", good.text
    assert _internal_errors(dense_server) == before


def test_null_is_the_default_of_every_optional_field(dense_server: Server) -> None:
    # the OpenAI API declares its optional fields nullable ("n": integer or null, defaults to 1)
    common = {name: None for name in ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                                      "stop_token_ids", "ignore_eos", "stream", "stream_options", "return_token_ids",
                                      "n", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "user",
                                      "min_p", "repetition_penalty", "response_format", "best_of")}
    completion = {**M, **common, "prompt": PROMPT, "echo": None, "suffix": None}
    chat = {**M, **common, "messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": None,
            "top_logprobs": None, "parallel_tool_calls": None, "tools": None, "tool_choice": None,
            "add_generation_prompt": None}
    with httpx.Client(base_url=dense_server.url, timeout=60) as http:
        out = http.post("/v1/completions", json=completion)
        assert out.status_code == 200, out.text
        assert out.json()["usage"]["completion_tokens"] <= 16  # the default max_tokens
        out = http.post("/v1/chat/completions", json=chat)
        assert out.status_code == 200, out.text


class _ByteTokens:
    """A tokenizer whose tokens are byte strings of several bytes (as byte-level BPE merges are)."""

    def __init__(self, tokens: list[bytes]) -> None:
        self.tokens = tokens

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return b"".join(self.tokens[i] for i in ids).decode("utf-8", errors="replace")


def test_a_stop_string_is_found_in_a_token_that_ends_on_an_incomplete_character() -> None:
    euro = "\u20ac".encode()  # 3 bytes
    tokenizer = _ByteTokens([b"a", b"bc" + euro[:1], euro[1:], b"d"])
    out = TextOutput(tokenizer, ("bc",))
    assert (out.push(0), out.push(1), out.stopped) == ("a", "", True)  # the stop string, then a partial euro
    assert out.flush() == ""
    out = TextOutput(tokenizer, ("zz",))
    assert [out.push(0), out.push(1), out.push(2), out.push(3)] == ["a", "bc", "\u20ac", "d"]
    out = TextOutput(tokenizer, ("c\u20ac",))
    assert [out.push(0), out.push(1), out.push(2), out.stopped] == ["a", "b", "", True]
    out = TextOutput(tokenizer, ())
    assert (out.push(0), out.push(1), out.flush()) == ("a", "bc", "\ufffd")  # ended on a partial character


def test_a_model_without_tokenizer_or_chat_template_refuses_text_and_chat_naming_the_field(
    mamba_server: Server,
) -> None:
    with httpx.Client(base_url=mamba_server.url, timeout=30) as http:
        chat = http.post("/v1/chat/completions", json={**M, "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
        assert "no chat template" in chat.json()["error"]["message"]
        for body, param in (({**M, "prompt": "hi"}, "prompt"), ({**M, "prompt": [1, 2], "stop": "x"}, "stop")):
            resp = http.post("/v1/completions", json=body)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
        ok = http.post("/v1/completions", json={**M, "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0,
                                                 "ignore_eos": True})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"].count(" ") == 4  # ids, space-separated


def test_logprobs_without_a_tokenizer_name_tokens_by_id(mamba_server: Server) -> None:
    out = mamba_server.client().completions.create(model="m", prompt=[5, 6, 7], max_tokens=4, temperature=0,
                                                   logprobs=2, extra_body={"ignore_eos": True,
                                                                           "return_token_ids": True})
    choice = out.choices[0]
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in choice.token_ids]  # vLLM's token-id form
    assert all(len(top) in (2, 3) and top[t] == lp for top, t, lp in zip(
        choice.logprobs.top_logprobs, choice.logprobs.tokens, choice.logprobs.token_logprobs))


def test_a_full_waiting_queue_answers_429_with_retry_after(demo: Path, tmp_path: Path) -> None:
    server = Server(demo, *DENSE[:-1], "1", "--max-waiting", "2", log=tmp_path / "err")
    try:
        async def one(client: httpx.AsyncClient) -> httpx.Response:
            return await client.post("/v1/completions", json={**M, "prompt": PROMPT, "max_tokens": 60,
                                                              "ignore_eos": True, "temperature": 0})

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return await asyncio.gather(*(one(client) for _ in range(8)))

        responses = asyncio.run(burst())
        codes = sorted(r.status_code for r in responses)
        assert codes.count(200) >= 2 and codes.count(429) >= 1 and set(codes) == {200, 429}, codes
        for r in responses:
            if r.status_code == 429:
                assert r.headers["Retry-After"] == "1" and r.json()["error"]["code"] == "rate_limit_exceeded"
            else:
                assert r.json()["choices"][0]["text"] == TEXT.removeprefix(PROMPT)[:60]
        assert server.idle_metrics()['infinilm_requests_rejected_total{status="429"}'] == codes.count(429)
    finally:
        assert server.stop() == 0


def test_sigterm_aborts_running_requests_and_exits_0(demo: Path, tmp_path: Path) -> None:
    server = Server(demo, *DENSE, "--max-model-len", "1024", "--shutdown-timeout", "0.5", log=tmp_path / "err")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http, http.stream(
            "POST", "/v1/completions",
            json={**M, "prompt": [1], "max_tokens": 1000, "ignore_eos": True, "stream": True},
        ) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")
            server.proc.send_signal(signal.SIGTERM)
            events = [line for line in lines if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        last = json.loads(events[-2][6:])
        assert last["choices"][0]["finish_reason"] == "abort" and len(events) < 1000
    finally:
        assert server.stop() == 0
    assert "shutting down, 1 request(s) in flight" in (tmp_path / "err").read_text()
