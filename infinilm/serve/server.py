"""``infinilm serve``: the aiohttp application over one engine, its socket, and graceful shutdown.

Startup: load the engine (`Engine.from_pretrained`: gates, weights, cache), read the tokenizer and chat
template, listen, then print one line ``infinilm serve: <model> on http://HOST:PORT ...`` (with ``--port 0``
the port the system chose) and serve until SIGTERM or SIGINT. Shutdown: new requests get 503, requests in
the engine have ``--shutdown-timeout`` seconds to finish, the rest are cancelled (``finish_reason: abort``),
connections close, the engine (its process, or its thread) ends, and `serve` returns 0. The connections'
limits (JSON answers to protocol errors, half-close, read timeouts, the body limit) are
`infinilm.serve.connection`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from aiohttp import web

from infinilm.config import ConfigError, EngineOptions
from infinilm.engine import Engine
from infinilm.serve.chat_template import load_chat_template
from infinilm.serve.connection import Runner, body_limits
from infinilm.serve.engine_client import EngineClient
from infinilm.serve.engine_core import engine_facts, freeze_heap
from infinilm.serve.engine_loop import EngineLoop
from infinilm.serve.engine_proc import EngineProcess, start_engine_process
from infinilm.serve.metrics import ServerMetrics
from infinilm.serve.routes import Routes
from infinilm.serve.schemas import ModelInfo
from infinilm.tokenizer import load_tokenizer

__all__ = ["create_app", "model_info", "serve", "start_engine"]

_DRAIN_POLL: Final = 0.05  # seconds between checks for the last request while draining
_KEEPALIVE: Final = 75.0  # seconds an idle keep-alive connection stays open (aiohttp's run_app and nginx's)


def model_info(facts: dict[str, Any], model: str, name: str | None = None) -> ModelInfo:
    """What request validation needs of the engine of `facts` (`engine_facts`), loaded from checkpoint directory
    `model`.

    Raises:
        ConfigError: an unreadable ``tokenizer.json`` or ``tokenizer_config.json``, or a chat template that
            does not compile.
    """
    return ModelInfo(name=name or model, vocab_size=facts["vocab_size"], max_model_len=facts["max_model_len"],
                     cache_block_size=facts["block_size"], cache_blocks=facts["num_blocks"],
                     tokenizer=load_tokenizer(model), render_chat=load_chat_template(model),
                     eos_token_ids=facts["eos_token_ids"])


def start_engine(factory: Callable[[], Engine], *, process: bool, max_waiting: int,
                 ) -> tuple[EngineClient, dict[str, Any]]:
    """The engine that `factory()` builds, in its own process (`infinilm.serve.engine_proc`; `factory` must
    pickle) or on a thread of this one (`infinilm.serve.engine_loop`); returns its client and its facts.

    Raises:
        EngineStartupError: the engine process did not start (`process`); else whatever `factory` raises.
    """
    if process:
        proc = start_engine_process(factory, max_waiting=max_waiting)
        return proc, proc.facts
    engine = factory()
    facts = engine_facts(engine)
    return EngineLoop(engine, ServerMetrics(facts["cache_kind"], facts["num_blocks"]), max_waiting=max_waiting), facts


def create_app(loop: EngineClient, info: ModelInfo, api_keys: Sequence[str] = (),
               read_timeout: float = 60.0) -> tuple[web.Application, Routes]:
    """The aiohttp application serving `loop`'s engine; the request body limit fits a full-length prompt, and a
    body has `read_timeout` seconds to arrive (`infinilm.serve.connection.body_limits`); with `api_keys`, the
    ``/v1`` routes need one of them (`infinilm.serve.middleware`)."""
    app = web.Application(client_max_size=max(1 << 20, 32 * info.max_model_len))
    routes = Routes(loop, info, loop.metrics, api_keys=api_keys)
    routes.install(app)
    app.middlewares.append(body_limits(read_timeout))  # innermost: after the API key, inside the error middleware
    return app, routes


def serve(args: argparse.Namespace, options: EngineOptions) -> int:
    """Run ``infinilm serve`` with the parsed `args` (see `infinilm.serve.commands`) until a signal; returns 0.

    The engine runs in its own process unless ``--no-engine-process`` or tensor parallel (whose ranks the
    engine starts itself, or torchrun does) asks for the thread.

    Raises:
        EngineStartupError: the engine process did not start (its error's text: a gate report, a bad
            checkpoint); ConfigError / GateError / LoadError: the engine does not load on the thread (as
            ``infinilm generate`` reports them); ConfigError too when the address cannot be listened on.
    """
    process = not getattr(args, "no_engine_process", False) and options.tensor_parallel_size == 1
    client, facts = start_engine(functools.partial(Engine.from_pretrained, args.model, options), process=process,
                                 max_waiting=args.max_waiting)
    try:
        info = model_info(facts, args.model, args.served_model_name)
        sock = _listen(args.host, args.port)
    except BaseException:
        if isinstance(client, EngineProcess):
            client.kill()
        raise
    asyncio.run(_serve(client, facts, info, sock, args))
    return 0


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as err:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({err.strerror or err})") from None


async def _serve(loop: EngineClient, facts: dict[str, Any], info: ModelInfo, sock: socket.socket,
                 args: argparse.Namespace) -> None:
    """Serve `loop`'s engine on `sock` until SIGTERM or SIGINT, then shut down (the module's docstring)."""
    loop.start()
    app, routes = create_app(loop, info, [args.api_key] if getattr(args, "api_key", None) else [],
                             read_timeout=args.read_timeout)
    rejected = loop.metrics.rejected
    runner = Runner(app, read_timeout=args.read_timeout, on_error=lambda status: rejected.labels(str(status)).inc(),
                    handler_cancellation=True, access_log=None, keepalive_timeout=_KEEPALIVE,
                    shutdown_timeout=args.shutdown_timeout + 5.0)
    await runner.setup()
    freeze_heap()
    await web.SockSite(runner, sock).start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    where = f"its own process (pid {loop.process.pid})" if isinstance(loop, EngineProcess) else "a thread"
    print(f"infinilm serve: {info.name} on {url} (max_model_len {info.max_model_len}, {facts['max_num_seqs']} "
          f"sequences per step, {info.cache_blocks} {facts['cache_kind']}s, chat template: "
          f"{'yes' if info.render_chat else 'no'}; {facts['graph_status']}; async scheduling: "
          f"{'on' if facts['async_scheduling'] else 'off'}; engine on {where})", flush=True)
    await stop.wait()
    routes.draining = True
    print(f"infinilm serve: shutting down, {len(loop.in_flight)} request(s) in flight", file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.shutdown_timeout
    while loop.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(_DRAIN_POLL)
    if loop.in_flight:
        loop.abort_all()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(_drained(loop), 5.0)
    await loop.stop()  # what is left gets its final event, so no handler is left waiting
    await runner.cleanup()


async def _drained(loop: EngineClient) -> None:
    while loop.in_flight:
        await asyncio.sleep(_DRAIN_POLL)
