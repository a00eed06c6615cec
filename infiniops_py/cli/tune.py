"""``infiniops tune``: time every implementation that accepts a problem bucket, and keep the times.

    infiniops tune OP [--device D] [--dtype T] [--size K=N ...] [--field K=V ...] [--force] [--write FILE]
    infiniops tune --model DIR [--device D] [--dtype T] [--force] [--write FILE]

With OP: synthetic inputs of the sizes given (``--size m=1 --size n=4096 --size k=1024`` for Gemm; the sizes
each operator takes and their defaults are `infiniops_py.tuning.inputs.SIZES`) and the problem fields given
(``--field trans_b=true``); prints the times and the resulting ranking (as ``infiniops explain`` does). With
``--model DIR``: builds the infinilm engine of that checkpoint, which tunes and warms every bucket its closure
runs (`infinilm.engine.warmup`; needs the llm extra). The times persist in this machine's cache
(`infiniops_py.tuning.store`); ``--write FILE`` also writes every measurement of the device to FILE, to ship
and read with ``INFINIOPS_TUNING=FILE``. ``--force`` times an operator's bucket again though it was measured.

Exit status: 0, 1 when nothing could be timed (no bucket had two candidates, or no provider serves the problem),
2 on bad usage (including a ``--budget`` that is negative or NaN, and a ``--write`` path that is a folder, a
device or a link to one: it is never replaced).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from infiniops_py.cli._command import Command, device, dtype, field_value, pairs

__all__ = ["COMMAND"]


def _seconds(text: str) -> float:
    """argparse type of ``--budget``: a number of seconds >= 0 (``inf``: no bound).

    Raises:
        argparse.ArgumentTypeError: not a number, negative, or NaN (argparse exits with status 2).
    """
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _arguments(parser: argparse.ArgumentParser) -> None:
    """``OP`` or ``--model DIR``, ``--device``, ``--dtype``, ``--size K=N``, ``--field K=V``, ``--force``,
    ``--write FILE``, ``--budget S``."""
    parser.add_argument("op", nargs="?", help="the operator (or --model DIR)")
    parser.add_argument("--model", metavar="DIR", help="tune the closure of this checkpoint's infinilm engine")
    parser.add_argument("--device", default="cpu", help="device type (default: cpu)")
    parser.add_argument("--dtype", default=None, help="dtype (default: float32; a model's: its checkpoint's)")
    parser.add_argument("--size", action="append", default=[], metavar="K=N", help="a size of the synthetic inputs")
    parser.add_argument("--field", action="append", default=[], metavar="K=V", help="a problem field")
    parser.add_argument("--force", action="store_true", help="time again the buckets already measured")
    parser.add_argument("--write", metavar="FILE", help="also write every measurement of the device to FILE")
    parser.add_argument("--budget", type=_seconds, default=120.0, metavar="S", help="bound in seconds (default 120)")


def _run(args: argparse.Namespace) -> int:
    """Tune; print the report; returns 0, 1 when nothing was timed, 2 on bad usage."""
    if (args.op is None) == (args.model is None):
        print("infiniops tune: give an operator or --model DIR (one of them)", file=sys.stderr)
        return 2
    try:
        device(args.device)
        if args.dtype is not None:
            args.dtype = dtype(args.dtype)
    except ValueError as err:
        print(f"infiniops tune: {err}", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"infiniops tune: --device {args.device}: this machine has no CUDA device", file=sys.stderr)
            return 2
    if args.write and not os.path.isdir(os.path.dirname(os.path.abspath(args.write))):
        print(f"infiniops tune: --write {args.write}: the folder does not exist", file=sys.stderr)
        return 2
    if args.write and os.path.exists(args.write) and not os.path.isfile(args.write):
        print(f"infiniops tune: --write {args.write}: is not a regular file (a folder, a device or a link to one)",
              file=sys.stderr)
        return 2
    from infiniops_py.errors import GateError

    try:
        report = _model(args) if args.model else _operator(args)
    except GateError as err:  # strict mode, or a problem nothing serves: the command's own failure
        print(f"infiniops tune: {err}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError) as err:
        print(f"infiniops tune: {err.args[0] if isinstance(err, KeyError) else err}", file=sys.stderr)
        return 2
    if report is None:
        return 2
    print(report.table())
    print(report.summary())
    if args.op:
        from infiniops_py import runtime

        for r in report.results:
            print(runtime.explain(r.problem).render())
    if args.write:
        from infiniops_py import runtime

        try:
            count = runtime.get_resolver().tuning.write(args.write, args.device.partition(":")[0])
        except OSError as err:
            print(f"infiniops tune: cannot write --write {args.write}: {err.strerror or err}", file=sys.stderr)
            return 2
        print(f"wrote {count} measurement(s) to {args.write} (use it with INFINIOPS_TUNING={args.write})")
    return 0 if report.count("measured") + report.count("reused") else 1


def _operator(args: argparse.Namespace) -> Any:
    from infiniops_py.operators import OPERATORS
    from infiniops_py.tuning import tune_problem

    spec = OPERATORS.get(args.op)
    if spec is None:
        raise ValueError(f"unknown operator {args.op!r}; known: {', '.join(OPERATORS)}")
    sizes = pairs(args.size, "--size", lambda name, text: int(text))
    fields = pairs(args.field, "--field", lambda name, text: field_value(text, spec.fields.get(name)))
    return tune_problem(args.op, device=args.device, dtype=args.dtype or "float32", sizes=sizes, fields=fields,
                        force=args.force, budget_s=args.budget, progress=_progress())


def _progress() -> Any:
    """On a terminal (stderr), a line per problem bucket as its timing starts (``tune_calls``' progress);
    None on a pipe."""
    if not sys.stderr.isatty():
        return None

    def line(done: int, total: int, label: str) -> None:
        if done < total:
            print(f"timing {label} ({done + 1}/{total})", file=sys.stderr, flush=True)

    return line


def _model(args: argparse.Namespace) -> Any:
    # infinilm is the model layer, above this one: imported only here, for this option
    try:
        from infinilm import Engine, EngineOptions
    except ImportError as err:
        print(f"infiniops tune --model: needs infinilm and the llm extra ({err})", file=sys.stderr)
        return None
    from infiniops_py.errors import GateError

    if args.force or args.size or args.field:
        print("infiniops tune --model: --force, --size and --field go with an operator (to time a model's buckets "
              "again, point INFINIOPS_CACHE at an empty folder)", file=sys.stderr)
        return None
    options: dict[str, Any] = {"device": args.device}
    if args.dtype:
        options["dtype"] = args.dtype
    saved = {k: os.environ.get(k) for k in ("INFINILM_TUNE", "INFINILM_TUNE_BUDGET")}
    os.environ.update(INFINILM_TUNE="1", INFINILM_TUNE_BUDGET=str(args.budget))  # the build tunes, on any device
    try:
        engine = Engine.from_pretrained(args.model, EngineOptions(**options))
    except GateError as err:
        print(f"infiniops tune --model: {err}", file=sys.stderr)
        return None
    except (OSError, RuntimeError, ValueError) as err:  # ConfigError, LoadError and CacheError among them
        print(f"infiniops tune --model: {type(err).__name__}: {err}", file=sys.stderr)
        return None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    print(engine.warmup.summary(), file=sys.stderr)
    return engine.warmup.tuning


COMMAND = Command("tune", "time the implementations of problem buckets and keep the fastest", _arguments, _run)
