"""``infinilm serve`` at the HTTP level: what raw sockets send (half-closes, bodies that never arrive, requests
the parser refuses, pipelining, slow headers) against the real server on 127.0.0.1; and that a prompt is
encoded off the event loop (in process, with aiohttp's test server).

No assertion depends on timing: every socket read has a generous timeout that only guards against a hang.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_serve import DENSE, M, Server, _server, demo  # noqa: F401 - demo is a fixture

from infinilm.demo import PROMPT, TEXT, build_byte_tokenizer
from infinilm.serve.errors import APIError
from infinilm.serve.metrics import ServerMetrics
from infinilm.serve.schemas import ModelInfo
from infinilm.serve.server import create_app

_spec = importlib.util.spec_from_file_location("serve_hostile", Path(__file__).parents[2] / "benchmarks" /
                                               "serve_hostile.py")
assert _spec is not None and _spec.loader is not None
HOSTILE = importlib.util.module_from_spec(_spec)  # the hostile pass's script: its reader of raw HTTP answers
_spec.loader.exec_module(HOSTILE)
HANG_GUARD = 60.0  # seconds: a read that waits this long has hung (the tests' answers come at once)
EXPECTED = TEXT.removeprefix(PROMPT)


@pytest.fixture(scope="module")
def proto_server(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # noqa: F811
    # a short read timeout, so that the timeout cases end soon; nothing else here waits for it
    yield from _server(demo, [*DENSE, "--read-timeout", "2"], tmp_path_factory.mktemp("logs") / "proto.err")


def _connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=HANG_GUARD)


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return data


def _request(body: dict[str, Any], *, path: str = "/v1/completions", extra: str = "") -> bytes:
    raw = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
            f"{extra}\r\n").encode() + raw


def _json_error(response: tuple[int, dict[str, str], bytes]) -> dict[str, Any]:
    _, headers, body = response
    assert headers["content-type"].startswith("application/json"), response
    error = json.loads(body)["error"]
    assert error["message"] and error["type"], error
    return error


GREEDY = {**M, "prompt": PROMPT, "max_tokens": 3, "temperature": 0}


def test_a_request_then_a_half_close_gets_its_answer_and_the_ones_pipelined_before(proto_server: Server) -> None:
    before = proto_server.metrics().get('infinilm_requests_finished_total{finish_reason="cancelled"}', 0.0)
    with _connect(proto_server) as sock:
        sock.sendall(_request(GREEDY))
        sock.shutdown(socket.SHUT_WR)
        [(status, headers, body)] = HOSTILE.responses(_read_all(sock))
    assert status == 200 and json.loads(body)["choices"][0]["text"] == EXPECTED[:3], body
    assert headers.get("connection") == "close"
    with _connect(proto_server) as sock:  # pipelined: a stream and two answers, then the half-close
        sock.sendall(_request({**GREEDY, "stream": True}) + _request({**GREEDY, "max_tokens": 5}) + _request(GREEDY))
        sock.shutdown(socket.SHUT_WR)
        stream, five, three = HOSTILE.responses(_read_all(sock))
    events = [line[6:] for line in stream[2].decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == "-Py"
    assert json.loads(five[2])["choices"][0]["text"] == EXPECTED[:5]
    assert json.loads(three[2])["choices"][0]["text"] == EXPECTED[:3]
    after = proto_server.idle_metrics().get('infinilm_requests_finished_total{finish_reason="cancelled"}', 0.0)
    assert after == before


def test_a_body_cut_short_by_a_half_close_is_a_400_naming_the_body(proto_server: Server) -> None:
    with _connect(proto_server) as sock:
        sock.sendall(_request(GREEDY)[:-5])
        sock.shutdown(socket.SHUT_WR)
        [answer] = HOSTILE.responses(_read_all(sock))
    assert answer[0] == 400 and _json_error(answer)["param"] == "body"


def test_a_content_length_above_the_limit_is_a_413_before_the_body_is_sent(proto_server: Server) -> None:
    with _connect(proto_server) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000\r\n\r\n")
        [answer] = HOSTILE.responses(_read_all(sock))  # the server answers and closes: no body was ever sent
    error = _json_error(answer)
    assert answer[0] == 413 and error["param"] == "body" and "1000000000" in error["message"]


def test_a_body_or_headers_that_never_arrive_are_a_408_and_the_connection_closes(proto_server: Server) -> None:
    before = proto_server.metrics().get('infinilm_requests_rejected_total{status="408"}', 0.0)
    with _connect(proto_server) as sock:
        sock.sendall(_request(GREEDY)[:-20])  # the headers and part of the body, then nothing
        [body_late] = HOSTILE.responses(_read_all(sock))
    assert body_late[0] == 408 and _json_error(body_late)["param"] == "body"
    for partial in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le", b""):  # slowloris, idle
        with _connect(proto_server) as sock:
            sock.sendall(partial)
            [headers_late] = HOSTILE.responses(_read_all(sock))
        assert headers_late[0] == 408 and "did not arrive" in _json_error(headers_late)["message"]
    after = proto_server.metrics().get('infinilm_requests_rejected_total{status="408"}', 0.0)
    assert after - before == 3


PROTOCOL_ERRORS = [  # what aiohttp's parser refuses: each a 4xx with the OpenAI error body, then close
    b"FOO /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),  # a TLS hello on the plain port
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
    b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n",
    b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\n{}",
    _request(GREEDY, extra="Connection: close\r\n") + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    _request(GREEDY, extra="Expect: 999-weird\r\n"),  # aiohttp answers 417 before any middleware runs
]


@pytest.mark.parametrize("raw", PROTOCOL_ERRORS, ids=range(len(PROTOCOL_ERRORS)))
def test_requests_the_http_parser_refuses_get_the_openai_error_body(proto_server: Server, raw: bytes) -> None:
    with _connect(proto_server) as sock:
        sock.sendall(raw)
        answers = HOSTILE.responses(_read_all(sock))
    assert answers and 400 <= answers[-1][0] < 500, answers
    for answer in answers:
        if answer[0] != 200:
            _json_error(answer)
    assert HOSTILE.responses(_read_all(_connect_and_send(proto_server, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                                               b"Connection: close\r\n\r\n")))[0][0] == 200


def _connect_and_send(server: Server, data: bytes) -> socket.socket:
    sock = _connect(server)
    sock.sendall(data)
    return sock


class _Engine:
    """What `create_app` needs of an `EngineLoop` to parse requests; submitting one is a 503."""

    metrics = ServerMetrics("kv_block", 8)
    max_waiting = 256

    def submit(self, prompt: list[int], params: object) -> None:
        raise APIError(503, "no engine in this test")


def test_prompts_are_encoded_off_the_event_loop() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    tokenizer, threads = build_byte_tokenizer(), []

    class Recording:
        def encode(self, text: str, add_special_tokens: bool = True) -> object:
            threads.append(threading.get_ident())
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)

    info = ModelInfo("m", 257, 256, 16, 64, Recording(), lambda messages: messages[-1]["content"])

    async def run() -> list[int]:
        app, _ = create_app(_Engine(), info)  # type: ignore[arg-type]
        async with TestClient(TestServer(app)) as client:
            for path, body in (("/v1/completions", {**M, "prompt": "x" * 200}),
                               ("/v1/chat/completions", {**M, "messages": [{"role": "user", "content": "hi"}]})):
                resp = await client.post(path, json=body)
                assert resp.status == 503, await resp.text()
            resp = await client.post("/tokenize", json={**M, "prompt": "x" * 200})
            assert resp.status == 200 and (await resp.json())["count"] >= 200
        return [threading.get_ident()]

    loop_thread = asyncio.run(run())
    assert len(threads) == 3 and loop_thread[0] not in threads
