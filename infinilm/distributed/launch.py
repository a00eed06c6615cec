"""Tensor-parallel processes: the process group, the followers rank 0 starts, their handshake, the step broadcast.

`join` makes this process a rank of a run of ``options.tensor_parallel_size`` ranks and returns its `Ranks`:

- launched by ``torchrun`` (or anything that sets torchrun's ``RANK`` and ``WORLD_SIZE``, with ``MASTER_ADDR``
  and ``MASTER_PORT``; ``LOCAL_RANK`` picks the device): it joins the run those name
  (``init_method="env://"``), as does each follower this module starts (it sets the same variables in it);
- otherwise the process is rank 0 and starts the other ranks itself, one process each
  (``torch.multiprocessing``, forkserver on Linux, else spawn; daemonic, so they end with it), each running
  `follower(*args)` (the engine's: the checks and gates, then join, load its shard and follow rank 0's
  steps). Each reports over a pipe when it is about to join the process group, when its weights are loaded
  (`Ranks.loaded`) and, when it fails, the error, which rank 0 raises (a follower that dies without a word,
  its end of the pipe closed, is reported with its exit code or signal); rank 0 waits for those, never for a
  collective a dead follower will not join. Rank 0 listens for the rendezvous (a ``TCPStore`` on a port the
  system picks) before it starts them, so no other process can take the port in between.

Joining is bounded: a rank that waits `RENDEZVOUS_SECONDS` for the others (a torchrun launch whose other ranks
never start, such as ``RANK`` and ``WORLD_SIZE`` left set by an earlier torchrun), or whose ``MASTER_PORT`` is
taken, raises `ConfigError` naming the variables. Once a step has been broadcast, a failure on rank 0 ends the
run (`Ranks.guard`): the followers are inside the step or gone, so no further step can run; the error of a
follower that failed or died is raised in place of the collective's.

Groups: the model's collectives (`infiniops_py.all_reduce`) run over ``torch.distributed``'s default group
(nccl on cuda, gloo on cpu, torch's default timeout); the step broadcast and the small agreements of the
start (the cache size) run over a separate gloo group on the CPU, whose timeout is a year: a follower waits
for rank 0's next step as long as rank 0 is idle (a server between requests). A process runs one
tensor-parallel engine at a time (the default group is per process). Rank ``r`` of a run on ``cuda:i`` uses
``cuda:(i + LOCAL_RANK)``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import multiprocessing.connection
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import torch

from infinilm.batch import Batch
from infinilm.config import ConfigError, EngineOptions
from infinilm.distributed.parallel import TensorParallel, backend_for
from infinilm.distributed.step import StepKind, receive_step, send_step

__all__ = ["RENDEZVOUS_SECONDS", "FollowerError", "Ranks", "join"]

_ENV: Final = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_PIPE_ENV: Final = "INFINILM_RANK_PIPE"  # a follower started here: the file descriptor of its pipe to rank 0
_CONTROL_TIMEOUT_DAYS: Final = 365
_POLL_SECONDS: Final = 0.05
_JOIN_SECONDS: Final = 30.0
_FAILURE_GRACE_SECONDS: Final = 5.0  # after a collective failed (a RuntimeError): how long to wait for the cause
RENDEZVOUS_SECONDS = 300.0  # how long a rank waits for every rank to join the process group


class FollowerError(RuntimeError):
    """A follower rank failed (its error, or its exit code when it died without one)."""


@dataclass
class _Follower:
    rank: int
    process: Any  # multiprocessing.Process
    pipe: multiprocessing.connection.Connection


class Ranks:
    """This process's rank in a tensor-parallel run, and what it owns of the run.

    Attributes:
        layout: its `TensorParallel` (size and rank).
        device: its device (``cuda:(i + LOCAL_RANK)`` on cuda).
        control: the gloo group of the step broadcast.
    """

    def __init__(self, layout: TensorParallel, device: str, control: Any, followers: list[_Follower],
                 parent: multiprocessing.connection.Connection | None) -> None:
        """`followers`: the ranks this process started (rank 0 of a run it launched); `parent`: a started
        follower's pipe to rank 0 (None under torchrun)."""
        self.layout, self.device, self.control = layout, device, control
        self._followers, self._parent = followers, parent
        self._closed = False
        self._ended: FollowerError | None = None  # the failure that ended the run (`guard`)
        if self.leader:  # the followers stop when rank 0's process exits, even if nobody closed the engine
            atexit.register(self.close)

    @property
    def leader(self) -> bool:
        """Whether this is rank 0 (the scheduler's rank)."""
        return self.layout.rank == 0

    def options(self, options: EngineOptions) -> EngineOptions:
        """`options` with this rank's device."""
        return dataclasses.replace(options, device=self.device)

    def loaded(self) -> None:
        """After this rank's weights are loaded: a follower started by rank 0 says so; rank 0 waits until every
        follower it started has said so.

        Raises:
            FollowerError: a follower failed (its error) or died (its exit code) before loading its weights.
        """
        if self._parent is not None:
            self._parent.send(("loaded", None))
        for f in self._followers:
            _wait(f, "loaded")

    def agree(self, n: int) -> int:
        """The smallest `n` over the ranks (each rank's cache holds the blocks they all have)."""
        import torch.distributed as dist

        value = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.control)
        return int(value.item())

    def send(self, kind: StepKind, batch: Batch | None) -> None:
        """Rank 0: broadcast the step the followers run next (`infinilm.distributed.step`).

        Raises:
            RuntimeError: this is not rank 0 (a follower runs rank 0's steps, never its own), or the run is
                closed. FollowerError: the run ended when a follower failed or died (that error, again).
        """
        if not self.leader:
            raise RuntimeError(f"rank {self.layout.rank} is a follower: only rank 0 schedules and runs steps")
        if self._ended is not None:
            raise FollowerError(f"the tensor-parallel run has ended: {self._ended}")
        if self._closed:
            raise RuntimeError("the tensor-parallel run is closed (Engine.close): it runs no further step")
        send_step(kind, batch, self.control)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Around what the ranks do together (the load, the start of the cache, each step on rank 0): an exception
        inside ends the run (the other ranks are inside the same work, or gone: nothing later could line up with
        theirs), terminating the followers rank 0 started and destroying the process group.

        Raises:
            FollowerError: a follower failed (its error) or died (its exit code): what made a collective fail here
                (a RuntimeError, the cause), found within a few seconds. Any other exception, as it was.
        """
        try:
            yield
        except FollowerError as err:
            self.close(abort=True)
            self._ended = err
            raise
        except BaseException as err:
            if self._closed:  # closed before (`send` refuses a step): no follower is left to explain it
                raise
            failure = self.failure(_FAILURE_GRACE_SECONDS if isinstance(err, RuntimeError) else 0.0)
            self.close(abort=True)
            if failure is None:
                raise
            self._ended = failure
            raise failure from err

    def receive(self) -> tuple[StepKind, Batch | None]:
        """A follower: the next step rank 0 broadcasts (blocks while rank 0 is idle)."""
        return receive_step(self.control)

    def failure(self, grace: float = 0.0) -> FollowerError | None:
        """The error a follower started here reported or died of, if one did (rank 0, after a collective
        failed), waiting up to `grace` seconds for one: a collective fails here as soon as the first socket of a
        dying follower closes, before its pipe has (a follower sends its error after it closed its process
        group)."""
        deadline = time.monotonic() + grace
        while True:
            for f in self._followers:
                message = _message(f)
                if message is not None:
                    return FollowerError(message)
            left = deadline - time.monotonic()
            if left <= 0 or not self._followers:
                return None
            multiprocessing.connection.wait([*(f.pipe for f in self._followers),
                                             *(f.process.sentinel for f in self._followers)], left)

    def close(self, *, abort: bool = False) -> None:
        """End the run: rank 0 broadcasts the stop (unless `abort`: a failure, the followers are terminated) and
        waits for the followers it started; every rank then destroys the process group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        import torch.distributed as dist

        if self.leader:
            atexit.unregister(self.close)
        if self.leader and not abort:
            try:
                send_step(StepKind.STOP, None, self.control)
            except RuntimeError:  # a follower is gone: nothing to stop
                abort = True
        for f in self._followers:
            if not abort:
                f.process.join(_JOIN_SECONDS)
            if f.process.is_alive():
                f.process.terminate()
                f.process.join(_JOIN_SECONDS)
            f.pipe.close()
        if self._parent is not None:
            self._parent.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _died(f: _Follower, when: str) -> str:
    """That `f` died `when`, with its exit code (or the signal that killed it), once its end of the pipe has
    closed or it is no longer alive (it is reaped first: the exit code is known only then)."""
    f.process.join(_JOIN_SECONDS)
    code = f.process.exitcode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            code = f"{code}, killed by {signal.Signals(-code).name}"
    return f"tensor-parallel rank {f.rank} died (exit code {code}) {when} without reporting an error"


def _message(f: _Follower) -> str | None:
    """The error `f` reported, or that it died, else None (it is alive and silent, said something else, or the run
    is closed: its pipe too)."""
    if f.pipe.closed:
        return None
    alive = f.process.is_alive()  # asked before the pipe is read: a follower that has exited sent all it sent
    while f.pipe.poll():
        try:
            what, detail = f.pipe.recv()
        except (EOFError, OSError):  # its end closed: it exited, or is exiting
            return _died(f, "during the run")
        if what == "error":
            return f"tensor-parallel rank {f.rank} failed: {detail}"
    if not alive:
        return _died(f, "during the run")
    return None


def _wait(f: _Follower, stage: str) -> None:
    """Block until follower `f` reports `stage`.

    Raises:
        FollowerError: it reported an error, or died (its end of the pipe closed, or it is not alive), first.
    """
    while True:
        if f.pipe.poll(_POLL_SECONDS):
            try:
                what, detail = f.pipe.recv()
            except (EOFError, OSError):  # EOF: poll() stays true, so this must end the wait
                raise FollowerError(_died(f, f"before it reported {stage!r}")) from None
            if what == stage:
                return
            if what == "error":
                raise FollowerError(f"tensor-parallel rank {f.rank} failed: {detail}")
        elif not f.process.is_alive() and not f.pipe.poll():  # what it sent before it exited is read first
            raise FollowerError(_died(f, f"before it reported {stage!r}"))


def _torchrun() -> tuple[int, int, int] | None:
    """``(RANK, WORLD_SIZE, LOCAL_RANK)`` of a torchrun launch (``RANK`` and ``WORLD_SIZE`` set; ``LOCAL_RANK``
    defaults to ``RANK``), else None: ``MASTER_ADDR``/``MASTER_PORT`` alone (a scheduler sets them for every job)
    make no launch.

    Raises:
        ConfigError: a launch without ``MASTER_ADDR`` or ``MASTER_PORT`` (the rendezvous); a rank, world size or
            local rank that is not an integer, or out of range (``0 <= RANK < WORLD_SIZE``, ``LOCAL_RANK >= 0``).
    """
    found = {k: os.environ.get(k) or None for k in _ENV}
    if found["RANK"] is None or found["WORLD_SIZE"] is None:
        return None
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if found[k] is None]
    if missing:
        raise ConfigError(f"RANK and WORLD_SIZE are set (a torchrun launch) but {' and '.join(missing)} not: set "
                          "the rendezvous address too, or unset RANK and WORLD_SIZE (rank 0 then starts the other "
                          "ranks itself)")
    try:
        rank, world = int(found["RANK"]), int(found["WORLD_SIZE"])
        local = int(found["LOCAL_RANK"] or rank)
    except ValueError:
        raise ConfigError(f"RANK, WORLD_SIZE and LOCAL_RANK must be integers, got {found}") from None
    if not 0 <= rank < world or local < 0:
        raise ConfigError(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}: a launch needs 0 <= RANK < "
                          "WORLD_SIZE and LOCAL_RANK >= 0")
    return rank, world, local


def _timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=RENDEZVOUS_SECONDS)


def _listen(size: int) -> Any:
    """Rank 0 of a run it starts: the rendezvous, a ``TCPStore`` on 127.0.0.1 at a port the system picks (its
    ``port``), listening before any follower starts."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=_timeout(), wait_for_workers=False)


def _rendezvous(rank: int, size: int, started: bool) -> Any:
    """The store of the run the environment names (``MASTER_ADDR``, ``MASTER_PORT``: torchrun's, or rank 0's for a
    follower it `started`), joined within `RENDEZVOUS_SECONDS` (rank 0 of a torchrun launch waits that long for
    every other rank to connect).

    Raises:
        ConfigError: the others did not come in time, the port could not be listened on (taken) or connected to,
            or it is not a port; naming the variables and the value of each.
    """
    import torch.distributed as dist

    try:
        store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=size, timeout=_timeout()))
    except (dist.DistError, ValueError) as err:
        where = f"MASTER_ADDR={os.environ.get('MASTER_ADDR')}, MASTER_PORT={os.environ.get('MASTER_PORT')}"
        cause = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
        if started:
            raise ConfigError(f"rank {rank} could not join rank 0's rendezvous ({where}) within "
                              f"{RENDEZVOUS_SECONDS:g} s ({cause})") from None
        raise ConfigError(
            f"RANK={rank} and WORLD_SIZE={size} are set (a torchrun launch), but this rank could not join the others "
            f"at {where} within {RENDEZVOUS_SECONDS:g} s ({cause}): start all {size} ranks (torchrun "
            f"--nproc-per-node {size}) on a free MASTER_PORT, or unset RANK and WORLD_SIZE if an earlier torchrun "
            "left them set (rank 0 then starts the other ranks itself)") from None
    return store


def _terminate(followers: list[_Follower]) -> None:
    for f in followers:
        if f.process.pid is not None:  # started
            f.process.terminate()
            f.process.join(_JOIN_SECONDS)
        f.pipe.close()


def _device(options: EngineOptions, local_rank: int) -> str:
    device = torch.device(options.device)
    if device.type != "cuda":
        return options.device
    return f"cuda:{(device.index or 0) + local_rank}"


def _follower_main(rank: int, size: int, port: int, threads: int, environ: dict[str, str],
                   pipe: multiprocessing.connection.Connection, follower: Callable[..., None],
                   args: tuple[Any, ...]) -> None:
    """A started follower: rank 0's environment `environ` (a forkserver's child would otherwise inherit the
    server's, as it was when the server started) with torchrun's variables for rank `rank` and the pipe's
    descriptor (`join` reads them), the resolver made again from it, rank 0's intra-op thread count, then
    `follower(*args)`; an error goes to rank 0 over `pipe` before the process exits with status 1.

    SIGINT is ignored: a Ctrl-C at a terminal reaches the whole process group, and rank 0 decides what it means
    (``infinilm serve`` finishes the requests in flight first, which needs every rank); a follower ends with
    rank 0's stop, its termination (SIGTERM) or rank 0's death (its connections close)."""
    import infiniops_py

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(environ, RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), **{_PIPE_ENV: str(pipe.fileno())})
    infiniops_py.reload()  # INFINIOPS_* as rank 0 has them
    torch.set_num_threads(threads)
    try:
        pipe.send(("started", None))
        follower(*args)
    except BaseException as err:
        with contextlib.suppress(OSError):  # rank 0 may be gone
            pipe.send(("error", f"{type(err).__name__}: {err}"))
        raise SystemExit(1) from None


def _start(followers: list[_Follower], size: int, port: int, follower: Callable[..., None],
           args: tuple[Any, ...]) -> None:
    """Start ranks 1 .. `size` - 1 (`_follower_main` with rendezvous `port`), each added to `followers` before it
    starts, so that a start that fails still leaves the ones before it to be terminated. The ranks share this
    host's cores: unless ``OMP_NUM_THREADS`` says otherwise, each rank (this one too, for the rest of the process)
    gets its share of torch's intra-op threads, as torchrun's one thread per rank does (all ranks with every core
    each ran the CPU decode about 10x slower on 2 cores)."""
    threads = torch.get_num_threads()
    if not os.environ.get("OMP_NUM_THREADS"):
        threads = max(1, threads // size)
        torch.set_num_threads(threads)
    ctx = _context()
    for r in range(1, size):
        end, child = ctx.Pipe()
        process = ctx.Process(target=_follower_main, name=f"infinilm-rank{r}", daemon=True,
                              args=(r, size, port, threads, dict(os.environ), child, follower, args))
        followers.append(_Follower(r, process, end))
        process.start()
        child.close()


def _context() -> Any:
    import torch.multiprocessing as mp

    if sys.platform != "linux":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["infinilm.engine"])  # the first start imports torch and infinilm once
    return ctx


def join(options: EngineOptions, follower: Callable[..., None], args: tuple[Any, ...]) -> Ranks:
    """Make this process a rank of a run of ``options.tensor_parallel_size`` ranks (see the module docstring);
    rank 0, unless torchrun's variables say otherwise, starts the others, each running `follower(*args)`.

    Raises:
        ConfigError: torchrun's ``WORLD_SIZE`` differs from ``tensor_parallel_size``, or its variables are not a
            launch (`_torchrun`) or name a rendezvous this rank cannot join within `RENDEZVOUS_SECONDS`
            (`_rendezvous`); this process runs a tensor-parallel engine already (its default process group is
            initialized); this process is a daemonic multiprocessing process (it may not start the others).
        FollowerError: a follower failed or died before joining the process group.
    """
    import torch.distributed as dist

    size = options.tensor_parallel_size
    if dist.is_initialized():
        raise ConfigError("tensor_parallel_size: this process runs a tensor-parallel engine already (or initialized "
                          "torch.distributed's default group itself); close that engine first")
    backend = backend_for(torch.device(options.device).type)
    found = _torchrun()
    followers: list[_Follower] = []
    parent: multiprocessing.connection.Connection | None = None
    if found is not None:
        rank, world, local = found
        if world != size:
            raise ConfigError(f"tensor_parallel_size={size} but torchrun's WORLD_SIZE={world}: they must agree")
        fd = os.environ.get(_PIPE_ENV)
        parent = multiprocessing.connection.Connection(os.dup(int(fd))) if fd else None
        store = _rendezvous(rank, size, started=parent is not None)
    else:
        if multiprocessing.current_process().daemon:
            raise ConfigError(f"tensor_parallel_size={size}: this process is a daemonic multiprocessing process, "
                              "which may not start the other ranks; run the engine in a process that is not "
                              "daemonic, or start every rank with torchrun")
        rank, local = 0, 0
        store = _listen(size)
    try:
        if found is None:
            _start(followers, size, store.port, follower, args)
        for f in followers:  # each runs the checks and gates too before it joins: rank 0 joins once they all have
            _wait(f, "joining")
        if parent is not None:
            parent.send(("joining", None))
        device = _device(options, local)
        if torch.device(device).type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=size)
        if backend == "nccl":  # the communicator is made lazily by the first collective: never inside a capture
            dist.all_reduce(torch.zeros(1, device=device))
        control = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=_CONTROL_TIMEOUT_DAYS))
    except BaseException:
        _terminate(followers)
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    return Ranks(TensorParallel(size, rank), device, control, followers, parent)

