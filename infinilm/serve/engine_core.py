"""The engine's side of the server: requests join and leave between steps, each step's events go out at once.

`EngineCore` owns the `Engine` and is the only code to touch it; it runs on the server's engine thread
(`infinilm.serve.engine_loop`) or in the engine process (`infinilm.serve.engine_proc`), and speaks to the
event loop's side (`infinilm.serve.engine_client`) in plain tuples of ints, floats and strings (what a pipe
pickles cheaply), vLLM V1's EngineCore protocol in small:

Inputs, each a tuple (a batch of them arrives together, handled in order between two steps):

- ``("add", rid, prompt, params)``: a request (``rid``: the client's number for it; ``prompt``: token ids;
  ``params``: its `SamplingParams`);
- ``("cancel", rid, reason)``: take it out of the engine (its KV blocks or state row are freed) and end it with
  `reason`; nothing when it has ended already;
- ``("abort", reason)``: cancel every request in the engine; ``("stop", reason)``: the same, then end `run`.

Outputs: one `Output` ``(now, events, state)`` per round that has something to say (events, or a change of
`state`): ``now`` is ``time.perf_counter()`` after the round's step (CLOCK_MONOTONIC: the same clock in
every process of the machine), ``state`` is ``(running, waiting, cache_used, preemptions)`` (the scheduler's
sets, the cache blocks or state rows held, the scheduler's preemptions so far), and each event is a tuple:

- ``(rid, token)``: a token, not the last;
- ``(rid, token, reason, logprob, top_logprobs, error)``: anything else: admitted (all None, ``()``), a token
  with logprobs or the last one (``reason``: ``stop`` for an EOS or stop token, ``length``), an end without a
  token (``reason``: the cancel's), a failure (``error``: ``(status, message, param)``: 400 for a prompt the
  engine refuses, ``ValueError``; 500 for a step that raised, which fails every request in the engine while
  the engine goes on, or for a request whose logits were not finite; 503 for a request added after ``stop``).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any, Final

from infinilm.distributed.launch import FollowerError
from infinilm.engine import Engine, StepOutput
from infinilm.engine.sequence import FinishReason, Sequence

__all__ = ["EngineCore", "Output", "State", "engine_facts", "freeze_heap"]

_IDLE_SLEEP: Final = 0.001  # seconds, when the engine has work that no step could schedule

State = tuple[int, int, int, int]
Output = tuple[float, list[tuple[Any, ...]], State]


def engine_facts(engine: Engine) -> dict[str, Any]:
    """What the server needs to know of a loaded `engine` (plain values: they cross the process boundary)."""
    from infinilm.engine.state_pool import StatePool

    allocator = engine.cache.allocator
    return {"vocab_size": engine.config.vocab_size, "max_model_len": engine.scheduler.max_model_len,
            "block_size": allocator.block_size, "num_blocks": allocator.num_blocks,
            "eos_token_ids": tuple(sorted(engine.scheduler.eos_token_ids)),
            "cache_kind": "state_row" if isinstance(engine.cache, StatePool) else "kv_block",
            "max_num_seqs": engine.options.max_num_seqs, "graph_status": engine.graph_status,
            "async_scheduling": engine.async_scheduling}


def freeze_heap() -> None:
    """Collect, then move every object that survived into the collector's permanent generation (`gc.freeze`,
    as vLLM does after startup): the engine's, the modules' and the app's objects are no longer traversed by
    the full collections that the requests' short-lived objects trigger. Call once a process has started."""
    gc.collect()
    gc.freeze()


class EngineCore:
    """Runs `engine` for the event loop's side: `run` until a ``stop`` input."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._seqs: dict[int, Sequence] = {}  # admitted requests in the engine, by the client's number
        self._rids: dict[int, int] = {}  # sequence id -> the client's number
        self._state: State | None = None

    def run(self, inputs: Callable[[bool], Iterable[tuple[Any, ...]]], publish: Callable[[Output], None]) -> None:
        """Serve until a ``stop`` input: `inputs(block)` returns the inputs that have arrived (blocking for one
        when `block`: the engine has no work); `publish` sends one round's `Output`.

        Raises:
            FollowerError: a tensor-parallel run has ended (its requests' 500 events are published first).
        """
        while True:
            events: list[tuple[Any, ...]] = []
            stopping = self._handle(inputs(not self.engine.has_work()), events)
            if not stopping and self.engine.has_work():
                try:
                    self._step(events)
                except FollowerError:  # a tensor-parallel run that ended runs no step again: its requests
                    self._publish(events, publish)  # hear it first
                    raise
            self._publish(events, publish)
            if stopping:
                return

    def _handle(self, msgs: Iterable[tuple[Any, ...]], events: list[tuple[Any, ...]]) -> bool:
        stopping = False
        for msg in msgs:
            kind = msg[0]
            if kind == "add":
                if stopping:
                    events.append((msg[1], None, None, None, (), (503, "the server is shutting down", None)))
                else:
                    self._add(msg[1], msg[2], msg[3], events)
            elif kind == "cancel":
                self._cancel(msg[1], msg[2], events)
            else:  # abort, stop
                for rid in list(self._seqs):
                    self._cancel(rid, msg[1], events)
                stopping |= kind == "stop"
        return stopping

    def _add(self, rid: int, prompt: list[int], params: Any, events: list[tuple[Any, ...]]) -> None:
        try:
            seq = self.engine.add_request(prompt, params)
        except ValueError as err:  # the engine's own prompt checks ("prompt: ..."); validation mirrors them
            events.append((rid, None, None, None, (), (400, str(err), "prompt")))
            return
        self._seqs[rid], self._rids[seq.id] = seq, rid
        events.append((rid, None, None, None, (), None))

    def _cancel(self, rid: int, reason: str, events: list[tuple[Any, ...]]) -> None:
        seq = self._seqs.pop(rid, None)
        if seq is None:  # never admitted, or its final event is already on its way
            return
        del self._rids[seq.id]
        self.engine.cancel(seq)
        events.append((rid, None, reason, None, (), None))

    def _step(self, events: list[tuple[Any, ...]]) -> None:
        try:
            outputs = self.engine.step()
        except Exception as err:  # the engine failed: fail its requests, keep serving
            traceback.print_exc(file=sys.stderr)
            error = (500, f"the engine failed in a step: {type(err).__name__}: {err}", None)
            for rid, seq in self._seqs.items():
                with contextlib.suppress(Exception):
                    self.engine.cancel(seq)
                events.append((rid, None, None, None, (), error))
            self._seqs.clear()
            self._rids.clear()
            if isinstance(err, FollowerError):
                raise
            return
        if not outputs:
            if self.engine.has_work():  # none could be scheduled (under async scheduling: the last step drained)
                time.sleep(_IDLE_SLEEP)
            return
        rids, seqs = self._rids, self._seqs
        for o in outputs:
            done = o.finished or o.seq.finish_reason is FinishReason.ERROR
            rid = rids.pop(o.seq.id) if done else rids[o.seq.id]
            if done:
                del seqs[rid]
            elif o.logprob is None:
                events.append((rid, o.token))
                continue
            events.append(_final(rid, o))

    def _publish(self, events: list[tuple[Any, ...]], publish: Callable[[Output], None]) -> None:
        scheduler, allocator = self.engine.scheduler, self.engine.cache.allocator
        state = (len(scheduler.running), len(scheduler.waiting), allocator.num_blocks - allocator.num_free,
                 scheduler.num_preemptions)
        if events or state != self._state:
            self._state = state
            publish((time.perf_counter(), events, state))


def _final(rid: int, o: StepOutput) -> tuple[Any, ...]:
    """The event of a step output that finished or carries logprobs."""
    seq = o.seq
    if seq.finish_reason is FinishReason.ERROR:  # this request failed alone (non-finite logits)
        return rid, None, None, None, (), (500, seq.error or "the request failed in the engine", None)
    reason = None if not o.finished else "stop" if seq.finish_reason is FinishReason.EOS else "length"
    return rid, o.token, reason, o.logprob, o.top_logprobs, None
