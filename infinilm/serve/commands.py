"""The ``serve`` and ``bench-serve`` subcommands: their arguments and entry points.

This module imports only argparse at import time; aiohttp (and prometheus-client, for ``serve``) are
imported when a command runs, and a missing one is reported as a `ConfigError` naming the ``serve`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys
from collections.abc import Callable
from typing import Final

from infinilm.config import ConfigError, EngineOptions

__all__ = ["add_bench_serve_args", "add_serve_args", "run_bench_serve", "run_serve"]

_SERVE_EXTRA: Final = ("aiohttp", "prometheus_client", "pydantic", "pydantic_core")  # the `serve` extra
API_KEY_ENV: Final = "INFINILM_API_KEY"  # vLLM's VLLM_API_KEY


def _number(convert: Callable[[str], float], noun: str, ok: Callable[[float], bool],
            rule: Callable[[str, float], str]) -> Callable[[str], float]:
    """An argparse type: `text` through `convert` (else "not <noun>"), then `ok` (else `rule`'s message)."""

    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(rule(text, value))
        return value

    return parse


_positive_int = _number(int, "an integer", lambda v: v >= 1, lambda t, v: f"{v} must be >= 1")
_port = _number(int, "a port number", lambda v: 0 <= v <= 65535,
                lambda t, v: f"{v} is not in [0, 65535] (0: any free port)")
_seconds = _number(float, "a number of seconds", lambda v: math.isfinite(v) and v >= 0,
                   lambda t, v: f"{t!r} must be a finite number >= 0")
_timeout = _number(float, "a number of seconds", lambda v: math.isfinite(v) and v > 0,
                   lambda t, v: f"{t!r} must be a finite number > 0")


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (or inf)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0 (inf: a closed loop)")
    return value


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """The options of ``infinilm serve`` besides the engine's (``--model``, ``--device``, ...)."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port (default: 8000; 0: a free one, printed)")
    p.add_argument("--served-model-name", default=None, help="the model name clients send (default: --model)")
    p.add_argument("--max-num-seqs", type=_positive_int, default=64, help="most requests per step (default: 64)")
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=8192,
                   help="most tokens per step (default: 8192)")
    p.add_argument("--max-waiting", type=_positive_int, default=256,
                   help="most requests waiting for their first token; more get 429 (default: 256)")
    p.add_argument("--shutdown-timeout", type=_seconds, default=30.0,
                   help="seconds running requests get to finish after SIGTERM (default: 30)")
    p.add_argument("--read-timeout", type=_timeout, default=60.0,
                   help="seconds a client has to send a request's headers, then its body; past them: 408 and the "
                   "connection closes (default: 60)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"the /v1 routes need 'Authorization: Bearer KEY', else 401 (default: ${API_KEY_ENV}, "
                   "else none; the variable keeps the key out of the process list)")
    p.add_argument("--no-engine-process", action="store_true",
                   help="run the engine on a thread of the server process instead of a process of its own (the "
                   "default with one device: the two then share no GIL); tensor parallel always runs it on a thread")
    p.add_argument("--disable-access-log", action="store_true",
                   help="no access log line per request on stderr (logger infinilm.serve.access)")


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    """The options of ``infinilm bench-serve``."""
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default: http://127.0.0.1:8000)")
    p.add_argument("--model", default=None, help="model name to send (default: the server's first model)")
    p.add_argument("--num-prompts", type=_positive_int, default=256)
    p.add_argument("--concurrency", type=_positive_int, default=64, help="most requests in flight (default: 64)")
    p.add_argument("--request-rate", type=_rate, default=math.inf,
                   help="requests per second, Poisson arrivals (default: inf, a closed loop)")
    p.add_argument("--input-len", type=_positive_int, default=128)
    p.add_argument("--output-len", type=_positive_int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="every request's temperature (default: 0, greedy)")
    p.add_argument("--top-p", type=float, default=None, help="every request's top_p (default: the server's)")
    p.add_argument("--top-k", type=int, default=None, help="every request's top_k (default: the server's)")
    p.add_argument("--timeout", type=_seconds, default=600.0, help="seconds for the whole run (default: 600)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")


def _missing(err: ModuleNotFoundError) -> ConfigError:
    if err.name not in _SERVE_EXTRA:
        raise err
    return ConfigError(f"{err.name} is not installed (fix: pip install 'infiniops-py[serve]')")


def run_serve(args: argparse.Namespace, options: EngineOptions) -> int:
    """``infinilm serve``: serve until SIGTERM; returns 0, or the CLI's status of the engine process's startup
    error (1: a gate report, 2: another error; its text printed on stderr).

    Raises:
        ConfigError: a package of the ``serve`` extra is missing, the API key is empty, or the address cannot be
            listened on; and
            whatever loading the engine raises (ConfigError, GateError, LoadError).
    """
    try:
        from infinilm.serve.engine_proc import EngineStartupError
        from infinilm.serve.middleware import ACCESS_LOG
        from infinilm.serve.server import serve
    except ModuleNotFoundError as err:
        raise _missing(err) from None
    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    if args.api_key is not None and not args.api_key.strip():
        raise ConfigError("--api-key: the key is empty")
    if args.disable_access_log:
        ACCESS_LOG.disabled = True
    elif not ACCESS_LOG.handlers:  # the embedding application's logging config wins where it set one
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        ACCESS_LOG.addHandler(handler)
        ACCESS_LOG.setLevel(logging.INFO)
        ACCESS_LOG.propagate = False
    try:
        return serve(args, options)
    except EngineStartupError as err:  # the engine process's error, as the CLI reports it on the thread
        print(str(err) if err.gate else f"infinilm serve: error: {err}", file=sys.stderr)
        return 1 if err.gate else 2


def run_bench_serve(args: argparse.Namespace) -> int:
    """``infinilm bench-serve``: prints the table (or JSON); returns 0 when every request completed, else 1.

    Raises:
        ConfigError: aiohttp is missing, the server does not answer, or the sizes do not fit it.
    """
    try:
        import aiohttp

        from infinilm.serve.bench_client import run_bench_serve as bench
    except ModuleNotFoundError as err:
        raise _missing(err) from None
    try:
        result = asyncio.run(bench(args.base_url, num_prompts=args.num_prompts, concurrency=args.concurrency,
                                   input_len=args.input_len, output_len=args.output_len,
                                   request_rate=args.request_rate, model=args.model, seed=args.seed,
                                   timeout=args.timeout, temperature=args.temperature, top_p=args.top_p,
                                   top_k=args.top_k))
    except (aiohttp.ClientError, ValueError) as err:
        raise ConfigError(f"--base-url {args.base_url}: {err}") from None
    print(result.to_json() if args.json else result.table())
    return 0 if result.failed == 0 else 1
