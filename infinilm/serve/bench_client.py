"""``infinilm bench-serve``: a load client for an OpenAI-compatible server, like ``vllm bench serve``.

Sends `num_prompts` streaming ``/v1/completions`` requests of random token-id prompts (`input_len` ids
drawn from the model card's ``vocab_size`` with a seeded `random.Random`), each asking for exactly
`output_len` tokens (``ignore_eos``, greedy), through aiohttp's client over at most `concurrency` connections.
Arrivals: a closed loop (each client sends its next request when the last one ends) when `request_rate` is
infinite, else a Poisson process of that many requests per second (exponential gaps from the same seed),
still capped at `concurrency` in flight. One warm-up request runs first and is not counted.

Per request: TTFT (send to the first token's chunk), ITL (the gaps between successive token chunks, the
server sending one chunk per token), end-to-end latency, and TPOT ((latency - TTFT) / (tokens - 1)).
Percentiles are linear interpolations between the closest ranks (numpy's default).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

__all__ = ["BenchServeResult", "RequestResult", "percentile", "run_bench_serve"]

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """One request's measurements (seconds); `error` is set for a failed request."""

    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str = ""


@dataclass(frozen=True)
class BenchServeResult:
    """The run's summary; latencies in milliseconds, throughputs per second over the whole run."""

    num_prompts: int
    concurrency: int
    request_rate: float
    input_len: int
    output_len: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    tpot_ms: dict[str, float]
    e2e_ms: dict[str, float]
    errors: tuple[str, ...] = ()

    def to_json(self) -> str:
        """The summary as a JSON object (an infinite request rate, a closed loop, is written ``"inf"``)."""
        data = asdict(self)
        if math.isinf(self.request_rate):
            data["request_rate"] = "inf"
        return json.dumps(data, indent=2)

    def table(self) -> str:
        rows = [
            ("requests completed / failed", f"{self.completed} / {self.failed}"),
            ("concurrency / request rate", f"{self.concurrency} / "
             f"{'closed loop' if math.isinf(self.request_rate) else f'{self.request_rate:g} req/s'}"),
            ("input / output tokens", f"{self.input_len} / {self.output_len}"),
            ("duration (s)", f"{self.duration_s:.2f}"),
            ("request throughput (req/s)", f"{self.request_throughput:.2f}"),
            ("output token throughput (tok/s)", f"{self.output_throughput:.1f}"),
            ("total token throughput (tok/s)", f"{self.total_token_throughput:.1f}"),
        ]
        for name, stats in (("TTFT", self.ttft_ms), ("ITL", self.itl_ms), ("TPOT", self.tpot_ms),
                            ("E2E latency", self.e2e_ms)):
            rows.append((f"{name} mean / p50 / p90 / p99 (ms)",
                         " / ".join(f"{stats[k]:.2f}" for k in ("mean", "p50", "p90", "p99"))))
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines += [f"error: {e}" for e in self.errors[:5]]
        return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    """The `q`-th percentile (0..100) of `values`, interpolating linearly between ranks; 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(values: list[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values]
    out = {"mean": statistics.fmean(ms) if ms else 0.0}
    out.update({f"p{q}": percentile(ms, q) for q in PERCENTILES})
    return out


async def _one(session: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> RequestResult:
    result = RequestResult()
    start = last = time.perf_counter()
    try:
        async with session.post(url, json=payload) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = str(chunk["error"].get("message"))
                    return result
                if not chunk.get("choices"):
                    continue  # the usage chunk
                now = time.perf_counter()
                if result.output_tokens == 0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                result.output_tokens += 1
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as err:
        result.error = f"{type(err).__name__}: {err}"
        return result
    result.latency = time.perf_counter() - start
    return result


async def run_bench_serve(base_url: str, *, num_prompts: int, concurrency: int, input_len: int, output_len: int,
                          request_rate: float = math.inf, model: str | None = None, seed: int = 0,
                          timeout: float = 600.0, temperature: float = 0.0, top_p: float | None = None,
                          top_k: int | None = None) -> BenchServeResult:
    """Run the load against the server at `base_url` (``http://127.0.0.1:8000``) and summarize it. Every request
    samples with `temperature` (0: greedy), `top_p` and `top_k` (None: the server's default), as vLLM's
    ``bench serve`` sends them.

    Raises:
        ValueError: a size below 1, a non-positive request rate, or `input_len` + `output_len` above the
            server's ``max_model_len``.
        aiohttp.ClientError: the server does not answer ``GET /v1/models``.
    """
    if min(num_prompts, concurrency, input_len, output_len) < 1:
        raise ValueError(f"num_prompts={num_prompts}, concurrency={concurrency}, input_len={input_len} and "
                         f"output_len={output_len} must all be >= 1")
    if not request_rate > 0:
        raise ValueError(f"request_rate={request_rate} must be > 0 (inf: a closed loop)")
    base_url = base_url.rstrip("/")
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        async with session.get(f"{base_url}/v1/models") as resp:
            resp.raise_for_status()
            card = (await resp.json())["data"][0]
        limit = card.get("max_model_len")
        if limit is not None and input_len + output_len > limit:
            raise ValueError(f"input_len={input_len} + output_len={output_len} exceeds the server's max_model_len "
                             f"{limit}")
        rng = random.Random(seed)
        vocab = int(card.get("vocab_size") or 256)
        prompts = [[rng.randrange(vocab) for _ in range(input_len)] for _ in range(num_prompts + 1)]
        url = f"{base_url}/v1/completions"

        def payload(prompt: list[int]) -> dict[str, Any]:
            body = {"model": model or card["id"], "prompt": prompt, "max_tokens": output_len,
                    "temperature": temperature, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            body.update({k: v for k, v in (("top_p", top_p), ("top_k", top_k)) if v is not None})
            return body

        warm = await _one(session, url, payload(prompts.pop()))
        if warm.error:
            raise ValueError(f"the warm-up request failed: {warm.error}")
        gaps = [0.0 if math.isinf(request_rate) else rng.expovariate(request_rate) for _ in prompts]
        gate = asyncio.Semaphore(concurrency)

        async def limited(prompt: list[int]) -> RequestResult:
            async with gate:
                return await _one(session, url, payload(prompt))

        start = time.perf_counter()
        tasks = []
        for prompt, gap in zip(prompts, gaps):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(limited(prompt)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    ok = [r for r in results if not r.error]
    out_tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return BenchServeResult(
        num_prompts=num_prompts, concurrency=concurrency, request_rate=request_rate, input_len=input_len,
        output_len=output_len, completed=len(ok), failed=len(results) - len(ok), duration_s=duration,
        request_throughput=len(ok) / duration, output_throughput=out_tokens / duration,
        total_token_throughput=(out_tokens + input_len * len(ok)) / duration,
        ttft_ms=_stats([r.ttft for r in ok]), itl_ms=_stats([g for r in ok for g in r.itl]), tpot_ms=_stats(tpot),
        e2e_ms=_stats([r.latency for r in ok]), errors=tuple(r.error for r in results if r.error),
    )
