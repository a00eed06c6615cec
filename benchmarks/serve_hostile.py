"""A hostile pass over ``infinilm serve`` and a bounded soak, against a server on 127.0.0.1 (the demo checkpoint).

    python benchmarks/serve_hostile.py [--soak-seconds 120] [--concurrency 16] [--read-timeout 2]

Cases (raw sockets and httpx): malformed HTTP, slowloris and idle connections, huge headers, bad JSON,
disconnects mid-stream (FIN and RST), concurrent cancels, pipelining, half-closes, long prompts and stop
strings. Each case checks that the server answered as documented (an OpenAI JSON error body for every 4xx/5xx,
or a closed connection where the notes say so) and that ``/health`` still answers 200. The soak then sends
`--concurrency` mixed requests at a time (streamed or not, completions and chat, stop strings, cancels, bad
requests) for `--soak-seconds`, and checks that the cache blocks return to 0 and the server's RSS stays flat.
Prints one line per failed case and a summary; exits 1 when a case failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from infinilm.demo import PROMPT, demo_checkpoint

TEMPLATE = "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
GUARD = 30.0  # seconds: a read that waits this long has hung


class Pass:
    def __init__(self, url: str) -> None:
        self.url = url
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.cases = 0
        self.failures: list[str] = []

    def check(self, name: str, ok: bool, detail: object = "") -> None:
        self.cases += 1
        if not ok:
            self.failures.append(f"{name}: {detail}")
            print(f"FAIL {name}: {str(detail)[:300]}", flush=True)

    def sock(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=GUARD)

    def raw(self, data: bytes, *, shut: bool = False) -> bytes:
        with self.sock() as s:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
            out = b""
            try:
                while chunk := s.recv(1 << 16):
                    out += chunk
            except (ConnectionResetError, TimeoutError) as err:
                out += f"<{type(err).__name__}>".encode()
            return out

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=GUARD).status_code == 200
        except httpx.HTTPError:
            return False

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=GUARD).text
        found = re.search(rf"^{re.escape(name)} ([\d.e+]+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    def idle_blocks(self) -> float:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.metric("infinilm_requests_running") == self.metric("infinilm_requests_waiting") == 0:
                break
            time.sleep(0.05)
        return self.metric('infinilm_cache_blocks_used{kind="kv_block"}')


def responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The HTTP/1.1 responses in `data`, in order: (status, headers in lower case, body), bodies read by
    Content-Length or chunks (tests/test_infinilm/test_serve_proto.py reads answers with it too)."""
    out = []
    while data.startswith(b"HTTP/1."):
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while data:
                size, _, data = data.partition(b"\r\n")
                n = int(size or b"0", 16)
                body, data = body + data[:n], data[n + 2:]
                if n == 0:
                    break
        else:
            n = int(headers.get("content-length", "0"))
            body, data = data[:n], data[n:]
        out.append((int(lines[0].split()[1]), headers, body))
    return out


def _json_errors_ok(answers: list[tuple[int, dict[str, str], bytes]]) -> bool:
    for status, headers, body in answers:
        if status >= 400:
            if not headers.get("content-type", "").startswith("application/json"):
                return False
            try:
                error = json.loads(body)["error"]
            except (ValueError, KeyError):
                return False
            if not error.get("message"):
                return False
    return True


def _post(body: dict[str, Any] | bytes, path: str = "/v1/completions", extra: str = "") -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
            f"{extra}\r\n").encode() + raw


OK = {"model": "m", "prompt": PROMPT, "max_tokens": 3, "temperature": 0}
MALFORMED: list[bytes] = [
    b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/1.1\n\n", b"\r\n\r\n\r\n", b"\x00" * 64,
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(60), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", b"GET / HTTP/1.1 extra\r\nHost: x\r\n\r\n", b"GET /\x00 HTTP/1.1\r\n\r\n",
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
    b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(300)) + b"\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\n: v\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\nX: \x00\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1e3\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: zstd\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: deflate\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nxxxx",
    _post(OK, extra="Connection: close\r\n") + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://evil/health HTTP/1.1\r\nHost: x\r\n\r\n", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT evil:443 HTTP/1.1\r\nHost: evil\r\n\r\n", b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"DELETE /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"GET /health HTTP/1.0\r\n\r\n", b"GET /%ff%fe HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /../../etc/passwd HTTP/1.1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 999-weird\r\nContent-Length: 2\r\n\r\n{}",
]
BAD_JSON: list[bytes] = [
    b"[" * 100000, b"{" * 100000, b'{"model": "m", "prompt": "x", "max_tokens": 1e999}', b"\xef\xbb\xbf{}",
    '{"model": "m"}'.encode("utf-16"), b'{"model": "m", "model": "x", "prompt": "y"}', b"null", b"1" * 5000,
    b'{"model": "m", "prompt": "x", "max_tokens": 3,}', b'{"model": "m", "prompt": [' + b"1," * 100000 + b"1]}",
    b'{"model": "m", "prompt": "x", "stop": ["' + b"y" * 1025 + b'"]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 900000 + b'"}]}',
    b'{"model": "m", "prompt": "' + b"x" * 1000000 + b'"}',
]


def malformed(p: Pass) -> None:
    for i, data in enumerate(MALFORMED):
        answers = responses(p.raw(data, shut=True))  # then the server answers what it has and closes
        p.check(f"malformed[{i}] answers are JSON errors", _json_errors_ok(answers), answers[:2])
        p.check(f"malformed[{i}] healthy after", p.healthy())
    for i, data in enumerate(BAD_JSON):
        answers = responses(p.raw(_post(data), shut=True))
        ok = len(answers) == 1 and 400 <= answers[0][0] < 500 and _json_errors_ok(answers)
        p.check(f"bad_json[{i}] is a 4xx JSON error", ok, answers[:1])
    p.check("bad json: healthy after", p.healthy())


def slow(p: Pass, read_timeout: float) -> None:
    socks = []
    for i in range(64):  # slowloris: partial headers, one byte now and then; and idle connections
        s = p.sock()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"")
        socks.append(s)
    served = httpx.post(f"{p.url}/v1/completions", json=OK, timeout=GUARD)
    p.check("slowloris: a normal request is served meanwhile", served.status_code == 200, served.text)
    time.sleep(read_timeout + 1)
    closed = 0
    for s in socks:
        try:
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            closed += data.startswith(b"HTTP/1.1 408")
        except OSError:
            pass
        s.close()
    p.check("slowloris: every slow connection got 408 and was closed", closed == len(socks), f"{closed}/{len(socks)}")
    with p.sock() as s:  # a body that trickles in: 408 once the read timeout has passed
        data = _post(OK)
        s.sendall(data[:-10])
        for b in data[-10:-1]:
            time.sleep(read_timeout / 8)
            s.send(bytes([b]))
        rest = b""
        try:
            while chunk := s.recv(4096):
                rest += chunk
        except OSError:
            pass
        p.check("trickled body: 408", rest.startswith(b"HTTP/1.1 408"), rest[:80])
    p.check("slow: healthy after", p.healthy())


def pipelining(p: Pass) -> None:
    reqs = [_post({**OK, "max_tokens": 1 + i % 4}) for i in range(10)]
    answers = responses(p.raw(b"".join(reqs) + _post(b"", extra="Connection: close\r\n")))
    texts = [json.loads(b)["choices"][0]["text"] for s, _, b in answers[:10] if s == 200]
    p.check("pipelined 10: answered in order", texts == ["-Py runs"[:1 + i % 4] for i in range(10)], texts)
    p.check("pipelined: the trailing bad one is a JSON 400", answers[-1:] and answers[-1][0] == 400, answers[-1:])
    mixed = [_post(OK), _post(b"{bad"), _post({**OK, "stream": True}), _post({"model": "zz", "prompt": "x"}), _post(OK)]
    answers = responses(p.raw(b"".join(mixed), shut=True))
    p.check("pipelined mixed + half-close: 5 answers", [a[0] for a in answers] == [200, 400, 200, 404, 200],
            [a[0] for a in answers])
    p.check("half-close after a whole request: answered", responses(p.raw(_post(OK), shut=True))[:1]
            and responses(p.raw(_post(OK), shut=True))[0][0] == 200)
    p.check("half-close mid-body: JSON 400", (responses(p.raw(_post(OK)[:-4], shut=True)) or [(0, {}, b"")])[0][0]
            == 400)
    p.check("pipelining: healthy after", p.healthy())


async def _disconnects(p: Pass) -> None:
    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection(p.host, p.port)
        writer.write(_post({**OK, "max_tokens": 200, "ignore_eos": True, "stream": i % 3 != 0}))
        await writer.drain()
        if i % 2:
            await asyncio.wait_for(reader.read(200), GUARD)  # the first bytes of the answer
        if i % 4 == 1:  # an abortive close: RST instead of FIN
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    await asyncio.gather(*(one(i) for i in range(64)))


async def _cancels(p: Pass) -> list[int]:
    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {**OK, "max_tokens": 100, "ignore_eos": True, "stream": True}
        try:
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                n = 0
                async for _ in resp.aiter_lines():
                    n += 1
                    if n > i % 5:
                        break
            return resp.status_code
        except httpx.HTTPError:
            return -1

    async with httpx.AsyncClient(base_url=p.url, timeout=GUARD) as client:
        tasks = [asyncio.create_task(one(client, i)) for i in range(48)]
        await asyncio.sleep(0.2)
        for t in tasks[::3]:
            t.cancel()
        return [r for r in await asyncio.gather(*tasks, return_exceptions=True) if isinstance(r, int)]


def disconnects(p: Pass) -> None:
    asyncio.run(_disconnects(p))
    p.check("64 mid-stream disconnects (FIN/RST): blocks return to 0", p.idle_blocks() == 0)
    codes = asyncio.run(_cancels(p))
    p.check("48 concurrent cancels: no 5xx", all(c in (200, -1) for c in codes), codes)
    p.check("concurrent cancels: blocks return to 0", p.idle_blocks() == 0)
    p.check("disconnects: healthy after", p.healthy())


def limits(p: Pass) -> None:
    answers = responses(p.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000000\r\n\r\n"))
    p.check("Content-Length 2e9: 413 at once", answers[:1] and answers[0][0] == 413, answers)
    stop = [c * 1024 for c in "abcd"]
    r = httpx.post(f"{p.url}/v1/completions", json={**OK, "max_tokens": 200, "ignore_eos": True, "stop": stop},
                   timeout=GUARD)
    p.check("4 stop strings of 1024 characters: served", r.status_code == 200, r.text[:200])
    r = httpx.post(f"{p.url}/v1/completions", json={**OK, "stop": ["x" * 200000] * 4}, timeout=GUARD)
    p.check("4 stop strings of 200k characters: 400 stop", r.status_code == 400 and r.json()["error"]["param"] ==
            "stop", r.text[:200])

    async def big_prompts() -> list[int]:
        async with httpx.AsyncClient(base_url=p.url, timeout=GUARD) as client:
            rs = await asyncio.gather(*(client.post("/v1/completions", json={**OK, "prompt": "x" * 1_000_000})
                                        for _ in range(8)))
            return [r.status_code for r in rs]

    p.check("8 prompts of 1M characters: 400 each", asyncio.run(big_prompts()) == [400] * 8)
    p.check("limits: healthy after", p.healthy())


async def _soak(p: Pass, seconds: float, concurrency: int, rng: random.Random) -> dict[str, int]:
    counts: dict[str, int] = {}
    end = time.monotonic() + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            kind = rng.choice(["stream", "plain", "chat", "stop", "cancel", "bad"])
            body: dict[str, Any] = {**OK, "max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.8])}
            path = "/v1/completions"
            if kind == "chat":
                path, body = "/v1/chat/completions", {"model": "m", "max_tokens": body["max_tokens"],
                                                      "messages": [{"role": "user", "content": PROMPT}]}
            elif kind == "stop":
                body["stop"] = ["runs", "zz"]
            elif kind == "bad":
                body["max_tokens"] = -1
            try:
                if kind in ("stream", "cancel"):
                    async with client.stream("POST", path, json={**body, "stream": True}) as resp:
                        n = 0
                        async for _ in resp.aiter_lines():
                            n += 1
                            if kind == "cancel" and n >= 2:
                                break
                        status = resp.status_code
                else:
                    status = (await client.post(path, json=body)).status_code
            except httpx.HTTPError as err:
                status = type(err).__name__  # type: ignore[assignment]
            key = f"{kind}:{status}"
            counts[key] = counts.get(key, 0) + 1

    async with httpx.AsyncClient(base_url=p.url, timeout=GUARD,
                                 limits=httpx.Limits(max_connections=concurrency * 2)) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return counts


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def soak(p: Pass, pid: int, seconds: float, concurrency: int) -> None:
    warm = asyncio.run(_soak(p, min(10.0, seconds / 4), concurrency, random.Random(1)))  # allocator warm-up
    rss0 = _rss_kib(pid)
    counts = asyncio.run(_soak(p, seconds, concurrency, random.Random(2)))
    rss1 = _rss_kib(pid)
    total = sum(counts.values())
    bad = {k: v for k, v in counts.items() if not (k.endswith(":200") or k == "bad:400")}
    print(f"soak: {total} requests in {seconds:g} s at {concurrency} concurrent (+{sum(warm.values())} warm-up); "
          f"{dict(sorted(counts.items()))}; RSS {rss0} -> {rss1} KiB", flush=True)
    p.check("soak: every request answered as expected", not bad, bad)
    p.check("soak: blocks return to 0", p.idle_blocks() == 0)
    p.check("soak: RSS flat (within 10% + 16 MiB)", rss1 <= rss0 * 1.1 + 16384, f"{rss0} -> {rss1} KiB")
    p.check("soak: healthy after", p.healthy())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--soak-seconds", type=float, default=120.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--read-timeout", type=float, default=2.0)
    args = ap.parse_args()
    model = demo_checkpoint(Path(tempfile.mkdtemp()))
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}))
    log = Path(tempfile.mkdtemp()) / "serve.err"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "infinilm.cli", "serve", "--model", str(model), "--host",
                                 "127.0.0.1", "--port", "0", "--served-model-name", "m", "--max-model-len", "256",
                                 "--block-size", "16", "--num-blocks", "64", "--max-num-seqs", "16", "--read-timeout",
                                 str(args.read_timeout)], stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
    if not found:
        print(f"the server did not start: {line}\n{log.read_text()}")
        return 2
    p = Pass(found.group(1))
    sections: list[tuple[str, Callable[[], None]]] = [
        ("malformed HTTP and bad JSON", lambda: malformed(p)), ("slowloris", lambda: slow(p, args.read_timeout)),
        ("pipelining and half-close", lambda: pipelining(p)), ("disconnects and cancels", lambda: disconnects(p)),
        ("limits", lambda: limits(p)), ("soak", lambda: soak(p, proc.pid, args.soak_seconds, args.concurrency)),
    ]
    try:
        for name, run in sections:
            before = p.cases
            start = time.perf_counter()
            run()
            print(f"{name}: {p.cases - before} checks in {time.perf_counter() - start:.1f} s", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    p.check("SIGTERM: exit 0", code == 0, code)
    print(f"{p.cases} checks, {len(p.failures)} failed; server log: {log}")
    return 1 if p.failures else 0


if __name__ == "__main__":
    sys.exit(main())
