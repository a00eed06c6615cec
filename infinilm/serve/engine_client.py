"""The event loop's side of the engine: admission, each request's events, the metrics.

`EngineClient` is what the routes talk to; a subclass carries its inputs to an `infinilm.serve.engine_core.
EngineCore` and hands it the core's outputs (`_on_output`, on the event loop): `infinilm.serve.engine_loop.
EngineLoop` runs the core on a thread of this process, `infinilm.serve.engine_proc.EngineProcess` in a
process of its own. Each output is one round of the core: its events, for every request at once, land in
their requests' `Events` here, and the metrics are observed here (the latencies from the core's
timestamp of the round, which is ``time.perf_counter``'s clock in either).

Admission control: at most `max_waiting` requests may wait for their first token; past that `submit` answers
429 with ``Retry-After``.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import itertools
import time
from dataclasses import dataclass
from typing import Any, Final

from infinilm.engine.sequence import SamplingParams
from infinilm.serve.engine_core import Output
from infinilm.serve.errors import APIError
from infinilm.serve.metrics import ServerMetrics, observe_many

__all__ = ["EngineClient", "Event", "Events", "Request"]


@dataclass(frozen=True)
class Event:
    """What the engine tells one request.

    Admitted: every field None. A token: `token`, and `finish_reason` when it was the last. An end without a
    token (``cancelled``, ``abort``): `finish_reason` only. A failure: `error`.

    Attributes:
        finish_reason: ``stop`` (EOS or a stop token), ``length``, ``cancelled``, ``abort`` (server shutdown),
            or a reason given to `EngineClient.cancel` (``stop`` for a stop string).
    """

    token: int | None = None
    finish_reason: str | None = None
    error: APIError | None = None
    logprob: float | None = None  # the token's, when the request asks for logprobs (`StepOutput.logprob`)
    top_logprobs: tuple[tuple[int, float], ...] = ()

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


_ADMITTED: Final = Event()


class Events:
    """One request's events, first in first out: filled by the event loop's side, read by one handler (the
    subset of `asyncio.Queue` the routes use, without its task accounting: a token costs one append and at most
    one wake-up)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Event] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, event: Event) -> None:
        self._items.append(event)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> Event:
        """The next event, once there is one (a cancelled wait takes none)."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()


class Request:
    """One engine request as the server sees it.

    Attributes:
        id: its number for the engine core (unique among its client's requests).
        prompt / params: what the engine runs.
        events: the `Event`s the engine sends, in order (`Events`); the last one is `Event.final`.
        arrival: `time.perf_counter` at submission (the latency histograms start there).
        num_tokens / last: tokens produced so far and the core's time of the last one.
        final / cancel_sent / waiting: a final event was delivered, a cancel was sent, no token has arrived yet.
    """

    __slots__ = ("arrival", "cancel_sent", "events", "final", "id", "last", "num_tokens", "params", "prompt",
                 "waiting")

    def __init__(self, request_id: int, prompt: list[int], params: SamplingParams) -> None:
        self.id = request_id
        self.prompt, self.params = prompt, params
        self.events = Events()
        self.arrival = time.perf_counter()
        self.num_tokens, self.last = 0, 0.0
        self.final = self.cancel_sent = False
        self.waiting = True


class EngineClient(abc.ABC):
    """The routes' engine; every method runs on the event loop. A subclass implements `_send`, `alive`,
    `start` and `stop`.

    Attributes:
        metrics: the server's metrics (observed here from the core's outputs).
        max_waiting: most requests waiting for their first token before `submit` answers 429.
        num_waiting: requests submitted that have no token yet.
        in_flight: requests submitted whose final event has not been delivered, by `Request.id`.
        failure: why the engine stopped, if it did (a description, or the exception that ended it).
    """

    def __init__(self, metrics: ServerMetrics, *, max_waiting: int) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting={max_waiting} must be >= 1")
        self.metrics, self.max_waiting = metrics, max_waiting
        self.num_waiting = 0
        self.in_flight: dict[int, Request] = {}
        self.failure: BaseException | str | None = None
        self._preemptions = 0
        self._ids = itertools.count()  # the requests' numbers for the core

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether the engine runs and takes requests."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start serving; call from the event loop that will read the events."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Abort what is left, end the engine and wait for it; every request gets its final event."""

    @abc.abstractmethod
    def _send(self, msg: tuple[Any, ...]) -> None:
        """Carry one input (`infinilm.serve.engine_core`) to the core."""

    def submit(self, prompt: list[int], params: SamplingParams) -> Request:
        """Queue a validated request for the engine; its first event says whether the engine admitted it.

        Raises:
            APIError: 429 (with ``Retry-After``) when `max_waiting` requests already wait; 503 when the engine
                is not running.
        """
        if not self.alive:
            raise APIError(503, "the engine is not running" + (f" (it failed: {self.failure!r})" if self.failure
                                                               else ""))
        if self.num_waiting >= self.max_waiting:
            raise APIError(429, f"the server's waiting queue is full ({self.max_waiting} requests wait for their "
                           "first token); retry later", code="rate_limit_exceeded", headers={"Retry-After": "1"})
        req = Request(next(self._ids), prompt, params)
        self.num_waiting += 1
        self.in_flight[req.id] = req
        self._send(("add", req.id, prompt, params))
        return req

    def cancel(self, req: Request, reason: str = "cancelled") -> None:
        """Take `req` out of the engine before the next step (its blocks or row are freed); idempotent.

        Its final event carries `reason` (``cancelled`` for a client gone, ``stop`` for a stop string), unless it
        finished first.
        """
        if not (req.final or req.cancel_sent):
            req.cancel_sent = True
            self._send(("cancel", req.id, reason))

    def abort_all(self) -> None:
        """Cancel every request in the engine now; their final events say ``abort``."""
        self._send(("abort", "abort"))

    def _on_output(self, out: Output) -> None:
        """One round of the core: its events to their requests, its state to the metrics."""
        now, events, (running, waiting, used, preemptions) = out
        m = self.metrics
        m.set_state(running, waiting, used)
        if preemptions > self._preemptions:
            m.preemptions.inc(preemptions - self._preemptions)
            self._preemptions = preemptions
        ttft: list[float] = []
        itl: list[float] = []
        requests = self.in_flight
        for e in events:
            req = requests.get(e[0])
            if req is None:  # failed here already (`_fail_all`)
                continue
            token = e[1]
            if token is not None:
                if req.num_tokens == 0:
                    ttft.append(now - req.arrival)
                else:
                    itl.append(now - req.last)
                req.num_tokens, req.last = req.num_tokens + 1, now
            self._deliver(req, Event(token) if len(e) == 2 else self._event(req, e, now))
        m.generation_tokens.inc(len(ttft) + len(itl))
        observe_many(m.ttft, ttft)
        observe_many(m.itl, itl)

    def _event(self, req: Request, e: tuple[Any, ...], now: float) -> Event:
        _, token, reason, logprob, top, error = e
        if error is not None:
            if error[0] == 500:
                self.metrics.finished.labels("error").inc()
            return Event(error=APIError(*error))
        if reason is not None:
            self.metrics.finished.labels(reason).inc()
            self.metrics.e2e.observe(now - req.arrival)
        elif token is None:  # admitted
            self.metrics.prompt_tokens.inc(len(req.prompt))
            return _ADMITTED
        return Event(token, reason, None, logprob, top)

    def _deliver(self, req: Request, event: Event) -> None:
        if req.waiting and (event.token is not None or event.final):
            req.waiting = False
            self.num_waiting -= 1
        if event.final:
            req.final = True
            del self.in_flight[req.id]
        req.events.put_nowait(event)

    def _fail_all(self, error: APIError) -> None:
        """Fail every request in flight with `error` (the engine is gone)."""
        for req in list(self.in_flight.values()):
            self._deliver(req, Event(error=error))
