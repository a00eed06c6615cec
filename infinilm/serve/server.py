"""``infinilm serve``: the aiohttp application over one engine, its socket, and graceful shutdown.

Startup: load the engine (`Engine.from_pretrained`: gates, weights, cache), read the tokenizer and chat
template, listen, then print one line ``infinilm serve: <model> on http://HOST:PORT ...`` (with ``--port 0``
the port the system chose) and serve until SIGTERM or SIGINT. Shutdown: new requests get 503, requests in
the engine have ``--shutdown-timeout`` seconds to finish, the rest are cancelled (``finish_reason: abort``),
connections close, the engine thread ends, and `serve` returns 0. The connections' limits (JSON answers to
protocol errors, half-close, read timeouts, the body limit) are `infinilm.serve.connection`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import Final

from aiohttp import web

from infinilm.config import ConfigError, EngineOptions
from infinilm.engine import Engine
from infinilm.engine.state_pool import StatePool
from infinilm.serve.chat_template import load_chat_template
from infinilm.serve.connection import Runner, body_limits
from infinilm.serve.engine_loop import EngineLoop
from infinilm.serve.metrics import ServerMetrics
from infinilm.serve.routes import Routes
from infinilm.serve.schemas import ModelInfo
from infinilm.tokenizer import load_tokenizer

__all__ = ["create_app", "model_info", "serve"]

_DRAIN_POLL: Final = 0.05  # seconds between checks for the last request while draining
_KEEPALIVE: Final = 75.0  # seconds an idle keep-alive connection stays open (aiohttp's run_app and nginx's)


def model_info(engine: Engine, model: str, name: str | None = None) -> ModelInfo:
    """What request validation needs of `engine`, loaded from checkpoint directory `model`.

    Raises:
        ConfigError: an unreadable ``tokenizer.json`` or ``tokenizer_config.json``, or a chat template that
            does not compile.
    """
    allocator = engine.cache.allocator
    return ModelInfo(name=name or model, vocab_size=engine.config.vocab_size,
                     max_model_len=engine.scheduler.max_model_len, cache_block_size=allocator.block_size,
                     cache_blocks=allocator.num_blocks, tokenizer=load_tokenizer(model),
                     render_chat=load_chat_template(model), eos_token_ids=tuple(sorted(engine.scheduler.eos_token_ids)))


def create_app(loop: EngineLoop, info: ModelInfo, api_keys: Sequence[str] = (),
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

    Raises:
        ConfigError / GateError / LoadError: the engine does not load (as ``infinilm generate`` reports them);
            ConfigError too when the address cannot be listened on.
    """
    engine = Engine.from_pretrained(args.model, options)
    info = model_info(engine, args.model, args.served_model_name)
    sock = _listen(args.host, args.port)
    asyncio.run(_serve(engine, info, sock, args))
    return 0


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as err:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({err.strerror or err})") from None


async def _serve(engine: Engine, info: ModelInfo, sock: socket.socket, args: argparse.Namespace) -> None:
    kind = "state_row" if isinstance(engine.cache, StatePool) else "kv_block"
    loop = EngineLoop(engine, ServerMetrics(kind, engine.cache.allocator.num_blocks), max_waiting=args.max_waiting)
    loop.start()
    app, routes = create_app(loop, info, [args.api_key] if getattr(args, "api_key", None) else [],
                             read_timeout=args.read_timeout)
    rejected = loop.metrics.rejected
    runner = Runner(app, read_timeout=args.read_timeout, on_error=lambda status: rejected.labels(str(status)).inc(),
                    handler_cancellation=True, access_log=None, keepalive_timeout=_KEEPALIVE,
                    shutdown_timeout=args.shutdown_timeout + 5.0)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"infinilm serve: {info.name} on {url} (max_model_len {info.max_model_len}, {engine.options.max_num_seqs} "
          f"sequences per step, {info.cache_blocks} {kind}s, chat template: "
          f"{'yes' if info.render_chat else 'no'}; {engine.graph_status}; async scheduling: "
          f"{'on' if engine.async_scheduling else 'off'})", flush=True)
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


async def _drained(loop: EngineLoop) -> None:
    while loop.in_flight:
        await asyncio.sleep(_DRAIN_POLL)
