"""The engine on one thread of the server process (``infinilm serve --no-engine-process``, and tensor parallel).

The engine is synchronous torch code, so one dedicated thread owns it (an `infinilm.serve.engine_core.
EngineCore`) and is the only one to touch it. The event loop's side (`infinilm.serve.engine_client`) puts its
inputs in a thread-safe inbox, which the thread drains between two steps; when the engine has no work the
thread blocks on the inbox. Each round's output goes to the event loop with one ``call_soon_threadsafe``.
The thread and the event loop share the GIL; `infinilm.serve.engine_proc` runs the core in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sys
import threading
import traceback
from typing import Any

from infinilm.engine import Engine
from infinilm.serve.engine_client import EngineClient, Event, Request
from infinilm.serve.engine_core import EngineCore, Output
from infinilm.serve.errors import APIError
from infinilm.serve.metrics import ServerMetrics

__all__ = ["EngineLoop", "Event", "Request"]


class EngineLoop(EngineClient):
    """Owns the engine thread.

    Attributes:
        engine: the engine (touched by the engine thread only, once started).
        failure: the exception that ended the engine thread, if one did (a bug: steps' exceptions are caught,
            but for the `FollowerError` of a tensor-parallel run that has ended).
    """

    def __init__(self, engine: Engine, metrics: ServerMetrics, *, max_waiting: int) -> None:
        super().__init__(metrics, max_waiting=max_waiting)
        self.engine = engine
        self._core = EngineCore(engine)
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="infinilm-engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        """Start the engine thread; call from the event loop that will read the events."""
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    async def stop(self) -> None:
        """Abort what is left, end the engine thread and wait for it."""
        if self.alive:
            self._inbox.put(("stop", "abort"))
            await asyncio.to_thread(self._thread.join)

    def _send(self, msg: tuple[Any, ...]) -> None:
        self._inbox.put(msg)

    # -- the engine thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._core.run(self._inputs, self._post)
        except BaseException as err:  # a bug in the core, or a tensor-parallel run that ended: fail every request
            self.failure = err  # rather than leave them hanging; /health says 503
            traceback.print_exc(file=sys.stderr)
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._fail_all, APIError(500, f"the engine thread failed: {err!r}"))
            raise

    def _inputs(self, block: bool) -> list[tuple[Any, ...]]:
        msgs = [self._inbox.get()] if block else []
        with contextlib.suppress(queue.Empty):
            while True:
                msgs.append(self._inbox.get_nowait())
        return msgs

    def _post(self, out: Output) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is listening
                self._loop.call_soon_threadsafe(self._on_output, out)
