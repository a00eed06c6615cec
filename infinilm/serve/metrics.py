"""The server's Prometheus metrics, through `prometheus_client` (the Prometheus project's own Python client).

Each server has its own `CollectorRegistry` (no process-global state: two servers in one process keep
separate counts). Names follow Prometheus' conventions and mirror vLLM's where one exists (``vllm:`` ->
``infinilm_``); counters get the ``_total`` suffix on exposition:

- ``infinilm_requests_running`` / ``infinilm_requests_waiting``: the scheduler's running set and waiting queue
  after the last engine step (a preempted request counts as waiting again).
- ``infinilm_cache_blocks_used`` / ``infinilm_cache_blocks_total`` with label ``kind``: ``kv_block`` (paged KV
  cache) or ``state_row`` (a recurrent model's state pool, one row per running request).
- ``infinilm_prompt_tokens_total``, ``infinilm_generation_tokens_total``: prompt tokens of admitted requests,
  tokens the engine generated (tokens produced for a request that was cancelled before reading them count).
- ``infinilm_requests_finished_total`` with label ``finish_reason``: ``stop`` (EOS, stop token or string),
  ``length``, ``cancelled`` (client disconnect), ``abort`` (server shutdown), ``error`` (engine failure).
- ``infinilm_requests_rejected_total`` with label ``status``: answered 4xx/5xx before reaching the engine.
- ``infinilm_engine_preemptions_total``: the scheduler's recompute preemptions.
- Histograms (seconds, server-side, from the request's arrival): ``infinilm_time_to_first_token_seconds``,
  ``infinilm_inter_token_latency_seconds`` (between consecutive tokens of a request),
  ``infinilm_e2e_request_latency_seconds``.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Sequence
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "ServerMetrics", "observe_many"]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
_TTFT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                        20.0, 40.0, 80.0)
_ITL_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                       0.75, 1.0, 2.5)
_E2E_BUCKETS: Final = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                       60.0, 120.0)


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each of `values`, with one locked update per bucket touched and one for the sum
    (an engine step's 64 inter-token latencies are 2 updates, not 128).

    Reads `prometheus_client`'s ``_upper_bounds``, ``_buckets`` and ``_sum`` (its ``observe`` does the same per
    value); a histogram without them (another version) gets ``observe`` per value.
    """
    bounds, buckets, total = (getattr(histogram, a, None) for a in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None:
        for v in values:
            histogram.observe(v)
        return
    if values:
        total.inc(sum(values))
        for i, n in Tally(bisect_left(bounds, v) for v in values).items():  # the first bound >= v, as observe
            buckets[i].inc(n)


class ServerMetrics:
    """The metrics of one server (see the module docstring); thread-safe, as `prometheus_client`'s metrics are.

    Attributes:
        cache_kind: ``kv_block`` or ``state_row``, the label of the cache gauges.
    """

    def __init__(self, cache_kind: str, cache_total: int) -> None:
        self.registry = r = CollectorRegistry()
        self.cache_kind = cache_kind
        self._state = threading.Lock()  # the gauges of `set_state` change at once for `render`
        self.running = Gauge("infinilm_requests_running", "Requests in the engine's running set", registry=r)
        self.waiting = Gauge("infinilm_requests_waiting", "Requests in the engine's waiting queue", registry=r)
        self.cache_used = Gauge("infinilm_cache_blocks_used", "KV-cache blocks (or state rows) held by requests",
                                ["kind"], registry=r)
        self.cache_total = Gauge("infinilm_cache_blocks_total", "KV-cache blocks (or state rows) in the cache",
                                 ["kind"], registry=r)
        self.cache_total.labels(cache_kind).set(cache_total)
        self.cache_used.labels(cache_kind).set(0)
        self.prompt_tokens = Counter("infinilm_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("infinilm_generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter("infinilm_requests_finished", "Requests that left the engine", ["finish_reason"],
                                registry=r)
        self.rejected = Counter("infinilm_requests_rejected", "Requests answered with an error before the engine",
                                ["status"], registry=r)
        self.preemptions = Counter("infinilm_engine_preemptions", "Recompute preemptions of the scheduler",
                                   registry=r)
        self.ttft = Histogram("infinilm_time_to_first_token_seconds", "Time from arrival to the first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("infinilm_inter_token_latency_seconds", "Time between consecutive tokens of a request",
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("infinilm_e2e_request_latency_seconds", "Time from arrival to the last token or end",
                             buckets=_E2E_BUCKETS, registry=r)

    def set_state(self, running: int, waiting: int, cache_used: int) -> None:
        """The gauges after an engine step, set together: a `render` meanwhile shows all of them before the step
        or all of them after it."""
        with self._state:
            self.running.set(running)
            self.waiting.set(waiting)
            self.cache_used.labels(self.cache_kind).set(cache_used)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        with self._state:
            return generate_latest(self.registry)
