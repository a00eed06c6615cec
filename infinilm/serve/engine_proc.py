"""The engine core in a process of its own (single-device ``infinilm serve``'s default), vLLM V1's split.

The server process keeps the HTTP side (routes, detokenization, stop strings, metrics); the engine process
runs an `infinilm.serve.engine_core.EngineCore`, so the two do not share a GIL. `start_engine_process` spawns
it (start method spawn: CUDA cannot be forked) with a picklable `factory` that builds the `Engine` there (the
same checkpoint and options, never a pickled engine) and waits for its handshake: ``ready`` with the
engine's facts (`engine_facts`), or its startup error, raised here as `EngineStartupError` (a gate report,
a bad checkpoint), or its exit without a word.

Transport: one Unix socket pair; each message is a frame (8-byte little-endian length, then a pickle). The
server sends a list of core inputs per event-loop iteration that has any; the engine sends one frame per
round of the core (every request's events of one step at once). On the server's side the socket is
non-blocking and read by the event loop itself (``add_reader``: no reader thread, so nothing else competes
for the server's GIL); a write the socket cannot take at once waits in a buffer (``add_writer``).

When the engine process ends unasked (killed, crashed), every request in flight gets a 500 error event,
`alive` turns False (``/health`` answers 503) and new requests get 503. When the server process ends, the
engine process sees the socket close (or its next write fail) and exits; SIGINT (a terminal's Ctrl-C
reaches the whole process group) is ignored there: the server decides when the engine stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, Final

from infinilm.engine import Engine
from infinilm.serve.engine_client import EngineClient
from infinilm.serve.engine_core import EngineCore, engine_facts, freeze_heap
from infinilm.serve.errors import APIError
from infinilm.serve.metrics import ServerMetrics

__all__ = ["EngineProcess", "EngineStartupError", "start_engine_process"]

_HEADER: Final = struct.Struct("<Q")
_CHUNK: Final = 1 << 20  # bytes per recv
_READS: Final = 16  # most recvs per wake-up of the event loop
_STOP_SECONDS: Final = 30.0  # for the engine process to end after a stop input (then it is killed)


class EngineStartupError(Exception):
    """The engine process did not start: its error's text (the CLI prints it), and whether it is a gate report
    (``infinilm``'s exit status 1, else 2)."""

    def __init__(self, text: str, *, gate: bool = False) -> None:
        super().__init__(text)
        self.gate = gate


def _frame(obj: object) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class _Frames:
    """Cuts a byte stream into its frames' objects."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf
        buf += data
        out, pos, size = [], 0, _HEADER.size
        while len(buf) - pos >= size:
            (n,) = _HEADER.unpack_from(buf, pos)
            if len(buf) - pos - size < n:
                break
            out.append(pickle.loads(buf[pos + size:pos + size + n]))
            pos += size + n
        del buf[:pos]
        return out


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


# -- the engine process ------------------------------------------------------------------------------------
def _startup_error(err: BaseException) -> tuple[str, str]:
    """``(kind, text)`` of an error building the engine: ``gate`` and the gate report, or ``error``."""
    from infinilm.config import ConfigError
    from infinilm.distributed.launch import FollowerError
    from infinilm.engine.gates import gate_report
    from infinilm.engine.kv_cache import CacheError
    from infinilm.engine.loader import LoadError
    from infiniops_py import GateError

    if isinstance(err, GateError):
        return "gate", gate_report(err)
    if isinstance(err, (ConfigError, LoadError, CacheError, ValueError, FollowerError)):
        return "error", str(err)
    if isinstance(err, ModuleNotFoundError):
        return "error", f"{err.name} is not installed (fix: pip install 'infiniops-py[llm]')"
    traceback.print_exc(file=sys.stderr)
    return "error", f"the engine failed to start: {type(err).__name__}: {err}"


def _engine_main(sock: socket.socket, factory: Callable[[], Engine]) -> None:
    """The engine process: build the engine, say so, serve the core until ``stop`` or the server is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        engine = factory()
    except BaseException as err:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the server is gone: nobody to tell
            sock.sendall(_frame(("failed", *_startup_error(err))))
        sys.exit(1)
    freeze_heap()
    try:
        sock.sendall(_frame(("ready", engine_facts(engine))))
    except (BrokenPipeError, ConnectionResetError):  # the server ended while this process loaded
        return
    frames = _Frames()

    def inputs(block: bool) -> list[tuple[Any, ...]]:
        msgs: list[tuple[Any, ...]] = []
        while True:
            try:
                data = sock.recv(_CHUNK, 0 if block and not msgs else socket.MSG_DONTWAIT)
            except BlockingIOError:
                return msgs
            if not data:
                raise EOFError
            for batch in frames.feed(data):
                msgs.extend(batch)

    with contextlib.suppress(EOFError, BrokenPipeError, ConnectionResetError):  # the server process is gone
        EngineCore(engine).run(inputs, lambda out: sock.sendall(_frame(out)))
    sock.close()


# -- the server process ------------------------------------------------------------------------------------
def start_engine_process(factory: Callable[[], Engine], *, max_waiting: int) -> EngineProcess:
    """Spawn the engine process, which builds its engine with `factory()` (a picklable callable: a module's
    function, or a `functools.partial` of one), and wait until it is ready.

    Raises:
        EngineStartupError: the engine did not build (its error's text), or the process ended before it was
            ready.
    """
    parent, child = socket.socketpair()
    proc = multiprocessing.get_context("spawn").Process(target=_engine_main, args=(child, factory),
                                                        name="infinilm-engine", daemon=True)
    proc.start()
    child.close()
    frames = _Frames()
    restore = _kill_on_sigterm(proc)
    try:
        while True:
            multiprocessing.connection.wait([parent, proc.sentinel])
            data = parent.recv(_CHUNK, socket.MSG_DONTWAIT) if _readable(parent) else b""
            if not data:
                proc.join(5.0)
                raise EngineStartupError(f"the engine process ended before it was ready ({_exit_text(proc.exitcode)})")
            got = frames.feed(data)
            if got:
                break
    except BaseException:
        proc.kill()
        parent.close()
        raise
    finally:
        restore()
    msg = got[0]
    if msg[0] == "failed":
        proc.join(5.0)
        parent.close()
        raise EngineStartupError(msg[2], gate=msg[1] == "gate")
    facts = msg[1]
    metrics = ServerMetrics(facts["cache_kind"], facts["num_blocks"])
    return EngineProcess(proc, parent, frames, facts, metrics, max_waiting=max_waiting)


def _kill_on_sigterm(proc: Any) -> Callable[[], None]:
    """Until the returned function is called: a SIGTERM first kills the engine process `proc`, then ends this
    process as it would have (a server stopped while its engine loads must not leave the engine loading, holding
    its device's memory, for minutes). Only where SIGTERM has its default action, in the main thread."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not \
            signal.SIG_DFL:
        return lambda: None

    def on_sigterm(signum: int, frame: object) -> None:
        proc.kill()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _readable(sock: socket.socket) -> bool:
    return bool(multiprocessing.connection.wait([sock], 0))


class EngineProcess(EngineClient):
    """The engine process's client (`start_engine_process` makes one).

    Attributes:
        facts: the engine's facts from the handshake (`engine_facts`).
        process: the engine process.
    """

    def __init__(self, process: Any, sock: socket.socket, frames: _Frames, facts: dict[str, Any],
                 metrics: ServerMetrics, *, max_waiting: int) -> None:
        super().__init__(metrics, max_waiting=max_waiting)
        self.process, self.facts = process, facts
        self._sock, self._frames = sock, frames
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[Any, ...]] = []  # inputs of this event-loop iteration, sent as one frame
        self._unsent = bytearray()  # what the socket could not take yet
        self._gone = self._stopping = False
        self._ended: asyncio.Event | None = None

    @property
    def alive(self) -> bool:
        return not self._gone and self.process.is_alive()

    def start(self) -> None:
        """Read the engine's outputs on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._ended = asyncio.Event()
        self._sock.setblocking(False)
        self._loop.add_reader(self._sock.fileno(), self._read)
        self._loop.add_reader(self.process.sentinel, self._exited)

    async def stop(self) -> None:
        """Abort what is left (each request gets its final event), end the engine process and wait for it."""
        if not self._gone and self._ended is not None:
            self._stopping = True
            self._send(("stop", "abort"))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ended.wait(), _STOP_SECONDS)
        await asyncio.to_thread(self.kill, 5.0)

    def kill(self, grace: float = 0.0) -> None:
        """End the engine process: wait up to `grace` seconds for it, then kill it; close the socket."""
        self.process.join(grace)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self._sock.close()

    def _send(self, msg: tuple[Any, ...]) -> None:
        if not self._pending and self._loop is not None:
            self._loop.call_soon(self._flush)
        self._pending.append(msg)

    def _flush(self) -> None:
        data, self._pending = _frame(self._pending), []
        if self._gone:
            return
        if self._unsent:
            self._unsent += data
            return
        try:
            n = self._sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError:
            self._lost()
            return
        if n < len(data):
            self._unsent += data[n:]
            self._loop.add_writer(self._sock.fileno(), self._write)  # type: ignore[union-attr]

    def _write(self) -> None:
        try:
            n = self._sock.send(self._unsent)
        except BlockingIOError:
            return
        except OSError:
            self._lost()
            return
        del self._unsent[:n]
        if not self._unsent:
            self._loop.remove_writer(self._sock.fileno())  # type: ignore[union-attr]

    def _read(self) -> None:
        outs: list[Any] = []
        ended = False
        for _ in range(_READS):  # bounded: a fast engine must not keep the loop from its streams
            try:
                data = self._sock.recv(_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                ended = True
                break
            outs.extend(self._frames.feed(data))
        for out in outs:
            self._on_output(out)
        if ended:
            self._lost()

    def _exited(self) -> None:
        self._read()  # what it sent before it ended
        self._lost()

    def _lost(self) -> None:
        """The engine process has ended: fail what is in flight, answer 503 from now on."""
        if self._gone:
            return
        self._gone = True
        loop = self._loop
        if loop is not None:
            loop.remove_reader(self._sock.fileno())
            loop.remove_reader(self.process.sentinel)
            loop.remove_writer(self._sock.fileno())
        self.process.join(1.0)
        why = _exit_text(self.process.exitcode)
        if self._stopping:
            self._fail_all(APIError(503, "the server is shutting down"))
        else:
            self.failure = f"the engine process ended ({why})"
            print(f"infinilm serve: {self.failure}", file=sys.stderr, flush=True)
            self._fail_all(APIError(500, f"the engine failed: {self.failure}"))
        if self._ended is not None:
            self._ended.set()
