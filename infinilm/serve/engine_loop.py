"""The one engine thread of the server: requests join and leave between steps.

The engine is synchronous torch code, so one dedicated thread owns it and is the only one to touch it.
The event loop talks to it through a thread-safe inbox (add, cancel, abort, stop). Between two steps the
thread drains the inbox: new prompts join the next step (continuous batching, as `Engine.step` does), and a
cancelled request leaves the engine (`Engine.cancel`: its KV blocks or state row are free) before the next
step runs. When the engine has no work the thread blocks on the inbox. After each step it hands the
step's events, for every request at once, to the event loop (one ``call_soon_threadsafe`` per step), where
each lands in its request's `asyncio.Queue`.

Admission control: at most `max_waiting` requests may wait for their first token; past that `submit` answers
429 with ``Retry-After``. A step that raises fails every request in the engine with a 500 error event,
cancels them, and the thread goes on serving; nothing a request carries reaches the engine unchecked
(`infinilm.serve.schemas`), and the engine's own refusal of a prompt (``ValueError``) is a 400 for that
request alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Final

from infinilm.distributed.launch import FollowerError
from infinilm.engine import Engine, StepOutput
from infinilm.engine.sequence import FinishReason, SamplingParams, Sequence
from infinilm.serve.errors import APIError
from infinilm.serve.metrics import ServerMetrics, observe_many

__all__ = ["EngineLoop", "Event", "Request"]

_IDLE_SLEEP: Final = 0.001  # seconds, when the engine has work that no step could schedule


@dataclass(frozen=True)
class Event:
    """What the engine thread tells one request.

    Admitted: every field None. A token: `token`, and `finish_reason` when it was the last. An end without a
    token (``cancelled``, ``abort``): `finish_reason` only. A failure: `error`.

    Attributes:
        finish_reason: ``stop`` (EOS or a stop token), ``length``, ``cancelled``, ``abort`` (server shutdown),
            or a reason given to `EngineLoop.cancel` (``stop`` for a stop string).
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


def _logprobs(step: StepOutput | None) -> tuple[float | None, tuple[tuple[int, float], ...]]:
    return (None, ()) if step is None else (step.logprob, step.top_logprobs)


class Request:
    """One engine request as the server sees it.

    Attributes:
        prompt / params: what the engine runs.
        events: the `Event`s the engine thread sends, in order; the last one is `Event.final`.
        arrival: `time.perf_counter` at submission (the latency histograms start there).
        seq: the engine's `Sequence` once admitted (set and read by the engine thread only).
        num_tokens / last: tokens produced so far and the time of the last one (engine thread only).
        final / cancel_sent / waiting: the event loop's view: a final event was delivered, a cancel was sent,
            no token has arrived yet.
    """

    __slots__ = ("arrival", "cancel_sent", "events", "final", "last", "num_tokens", "params", "prompt", "seq",
                 "waiting")

    def __init__(self, prompt: list[int], params: SamplingParams) -> None:
        self.prompt, self.params = prompt, params
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.arrival = time.perf_counter()
        self.seq: Sequence | None = None
        self.num_tokens, self.last = 0, 0.0
        self.final = self.cancel_sent = False
        self.waiting = True


class EngineLoop:
    """Owns the engine thread; every method but the thread's own runs on the event loop.

    Attributes:
        engine: the engine (touched by the engine thread only, once started).
        max_waiting: most requests waiting for their first token before `submit` answers 429.
        num_waiting: requests submitted that have no token yet.
        in_flight: requests submitted whose final event has not been delivered.
        failure: the exception that ended the engine thread, if one did (a bug: steps' exceptions are caught,
            but for the `FollowerError` of a tensor-parallel run that has ended).
    """

    def __init__(self, engine: Engine, metrics: ServerMetrics, *, max_waiting: int) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting={max_waiting} must be >= 1")
        self.engine, self.metrics, self.max_waiting = engine, metrics, max_waiting
        self.num_waiting = 0
        self.in_flight: set[Request] = set()
        self.failure: BaseException | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Request | None, str]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="infinilm-engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: dict[int, Request] = {}  # engine thread: admitted requests by sequence id
        self._preemptions = 0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        """Start the engine thread; call from the event loop that will read the events."""
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    def submit(self, prompt: list[int], params: SamplingParams) -> Request:
        """Queue a validated request for the engine; its first event says whether the engine admitted it.

        Raises:
            APIError: 429 (with ``Retry-After``) when `max_waiting` requests already wait; 503 when the engine
                thread is not running.
        """
        if not self.alive:
            raise APIError(503, "the engine is not running" + (f" (it failed: {self.failure!r})" if self.failure
                                                               else ""))
        if self.num_waiting >= self.max_waiting:
            raise APIError(429, f"the server's waiting queue is full ({self.max_waiting} requests wait for their "
                           "first token); retry later", code="rate_limit_exceeded", headers={"Retry-After": "1"})
        req = Request(prompt, params)
        self.num_waiting += 1
        self.in_flight.add(req)
        self._inbox.put(("add", req, ""))
        return req

    def cancel(self, req: Request, reason: str = "cancelled") -> None:
        """Take `req` out of the engine before the next step (its blocks or row are freed); idempotent.

        Its final event carries `reason` (``cancelled`` for a client gone, ``stop`` for a stop string), unless it
        finished first.
        """
        if not (req.final or req.cancel_sent):
            req.cancel_sent = True
            self._inbox.put(("cancel", req, reason))

    def abort_all(self) -> None:
        """Cancel every request in the engine now; their final events say ``abort``."""
        self._inbox.put(("abort", None, "abort"))

    async def stop(self) -> None:
        """Abort what is left, end the engine thread and wait for it."""
        if self.alive:
            self._inbox.put(("stop", None, "abort"))
            await asyncio.to_thread(self._thread.join)

    # -- the engine thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                out: list[tuple[Request, Event]] = []
                stopping = self._drain(out)
                if not stopping and self.engine.has_work():
                    self._step(out)
                self._publish(out)
                if stopping:
                    return
        except BaseException as err:  # a bug in this loop: fail every request rather than leave them hanging
            self.failure = err
            traceback.print_exc(file=sys.stderr)
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._fail_all, APIError(500, f"the engine thread failed: {err!r}"))
            raise

    def _drain(self, out: list[tuple[Request, Event]]) -> bool:
        msgs = [] if self.engine.has_work() else [self._inbox.get()]
        with contextlib.suppress(queue.Empty):
            while True:
                msgs.append(self._inbox.get_nowait())
        stopping = False
        for kind, req, reason in msgs:
            if kind == "add" and req is not None:
                if stopping:
                    out.append((req, Event(error=APIError(503, "the server is shutting down"))))
                else:
                    self._add(req, out)
            elif kind == "cancel" and req is not None:
                self._cancel(req, reason, out)
            else:  # abort, stop
                for r in list(self._live.values()):
                    self._cancel(r, reason, out)
                stopping |= kind == "stop"
        return stopping

    def _add(self, req: Request, out: list[tuple[Request, Event]]) -> None:
        try:
            seq = self.engine.add_request(req.prompt, req.params)
        except ValueError as err:  # the engine's own prompt checks ("prompt: ..."); validation mirrors them
            out.append((req, Event(error=APIError(400, str(err), "prompt"))))
            return
        req.seq = seq
        self._live[seq.id] = req
        self.metrics.prompt_tokens.inc(len(req.prompt))
        out.append((req, _ADMITTED))

    def _cancel(self, req: Request, reason: str, out: list[tuple[Request, Event]]) -> None:
        seq = req.seq
        if seq is None or seq.id not in self._live:  # never admitted, or its final event is already on its way
            return
        self.engine.cancel(seq)
        del self._live[seq.id]
        self._end(req, reason, None, out)

    def _end(self, req: Request, reason: str, token: int | None, out: list[tuple[Request, Event]],
             step: StepOutput | None = None) -> None:
        self.metrics.finished.labels(reason).inc()
        self.metrics.e2e.observe(time.perf_counter() - req.arrival)
        out.append((req, Event(token, reason, None, *_logprobs(step))))

    def _step(self, out: list[tuple[Request, Event]]) -> None:
        try:
            outputs = self.engine.step()
        except Exception as err:  # the engine failed: fail its requests, keep serving
            traceback.print_exc(file=sys.stderr)
            error = APIError(500, f"the engine failed in a step: {type(err).__name__}: {err}")
            for req in list(self._live.values()):
                with contextlib.suppress(Exception):
                    self.engine.cancel(req.seq)  # type: ignore[arg-type]
                self.metrics.finished.labels("error").inc()
                out.append((req, Event(error=error)))
            self._live.clear()
            if isinstance(err, FollowerError):  # a tensor-parallel run that ended runs no step again: end the
                self._publish(out)  # thread too (`failure`), so that /health says 503 and new requests get it
                raise
            return
        if not outputs:
            if self.engine.has_work():  # none could be scheduled (under async scheduling: the last step drained)
                time.sleep(_IDLE_SLEEP)
            return
        now = time.perf_counter()
        self.metrics.generation_tokens.inc(len(outputs))
        ttft: list[float] = []
        itl: list[float] = []
        for o in outputs:
            req = self._live[o.seq.id]
            if req.num_tokens == 0:
                ttft.append(now - req.arrival)
            else:
                itl.append(now - req.last)
            req.num_tokens, req.last = req.num_tokens + 1, now
            if o.seq.finish_reason is FinishReason.ERROR:  # this request failed alone (non-finite logits)
                del self._live[o.seq.id]
                self.metrics.finished.labels("error").inc()
                out.append((req, Event(error=APIError(500, o.seq.error or "the request failed in the engine"))))
            elif o.finished:
                del self._live[o.seq.id]
                self._end(req, "stop" if o.seq.finish_reason is FinishReason.EOS else "length", o.token, out, o)
            else:
                out.append((req, Event(o.token, None, None, *_logprobs(o))))
        observe_many(self.metrics.ttft, ttft)
        observe_many(self.metrics.itl, itl)

    def _publish(self, out: list[tuple[Request, Event]]) -> None:
        scheduler, allocator = self.engine.scheduler, self.engine.cache.allocator
        self.metrics.set_state(len(scheduler.running), len(scheduler.waiting),
                               allocator.num_blocks - allocator.num_free)
        if scheduler.num_preemptions > self._preemptions:
            self.metrics.preemptions.inc(scheduler.num_preemptions - self._preemptions)
            self._preemptions = scheduler.num_preemptions
        if out:
            self._post(out)

    def _post(self, out: list[tuple[Request, Event]]) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is listening
                self._loop.call_soon_threadsafe(self._deliver, out)

    # -- the event loop --------------------------------------------------------------------------------
    def _deliver(self, out: list[tuple[Request, Event]]) -> None:
        for req, event in out:
            if req.final:
                continue
            if req.waiting and (event.token is not None or event.final):
                req.waiting = False
                self.num_waiting -= 1
            if event.final:
                req.final = True
                self.in_flight.discard(req)
            req.events.put_nowait(event)

    def _fail_all(self, error: APIError) -> None:
        self._deliver([(req, Event(error=error)) for req in list(self.in_flight)])
