"""The engine: gates, load, then one straight data path per step.

``Engine.from_pretrained`` reads the config (`infinilm.models.registry.read_config`), checks the options
(`infinilm.engine.checks`), runs the gates (`infinilm.engine.gates.plan`, which raises `GateError` before any
weight is read), checks the checkpoint's safetensors headers against the model's tensors
(`infinilm.engine.loader`, before anything is allocated), builds the family's model and loads the weights,
then sizes the cache of the family's kind: a paged KV cache and the attention runner, or, for a recurrent
model, the state pool of `infinilm.engine.state_pool` (one row per running request) and the recurrent runner
(`infinilm.engine.runner`). Each `step` is: schedule -> prepare inputs -> run model -> sample -> postprocess.
Requests can be added and cancelled between steps; new prefills join the running decodes in the next step.
Each running sequence holds a row of persistent step inputs (`infinilm.engine.input_batch.SeqRows`: its block
table, length and last token), which the scheduler keeps up to date, so a decode step's host work depends on the
batch size alone. The step synchronizes with the device once: where sampling reads the sampled ids. With
``EngineOptions.async_scheduling`` (on CUDA by default) the engine launches the next step before it reads this
one's ids, so the host's work overlaps the device's (`infinilm.engine.overlap`). On the CPU
the engine picks its thread count by timing its decode step (`infinilm.engine.threads`); `threads_status` says
what it chose.

With ``tensor_parallel_size > 1`` the gates (which also check that the model splits) and the header check (against
rank 0's shard) run first, then the ranks start (`infinilm.distributed.launch`); each loads its shard of every
weight and sizes its cache of its heads, the ranks agree on the smallest cache, and then rank 0 runs the
scheduler and sampling and broadcasts each step's batch (`infinilm.distributed.step`), which the other ranks run
in `Engine.follow`. `Engine.close` stops them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from infinilm.batch import Batch
from infinilm.config import ConfigError, EngineOptions, ModelConfig
from infinilm.distributed.launch import Ranks, join
from infinilm.distributed.parallel import TensorParallel
from infinilm.distributed.step import StepKind
from infinilm.engine.checks import cache_class, check_options, check_prompt, max_positions
from infinilm.engine.gates import overrides, plan
from infinilm.engine.input_batch import SeqRows
from infinilm.engine.kv_cache import BlockAllocator
from infinilm.engine.loader import Checkpoint, load_weights, read_checkpoint
from infinilm.engine.overlap import HostIds, InFlight
from infinilm.engine.runner import AttentionRunner, RecurrentRunner, Runner
from infinilm.engine.sampling import logprobs, sample, sample_ids
from infinilm.engine.scheduler import Scheduler
from infinilm.engine.sequence import SamplingParams, SeqStatus, Sequence
from infinilm.engine.state_pool import StatePool
from infinilm.engine.threads import calibrate_threads, using_threads
from infinilm.engine.warmup import WarmupReport, decode_padding, warm_up
from infinilm.models.family import CausalLM, GatePlan
from infinilm.models.registry import family_of, read_config
from infiniops_py import unchecked_indices

__all__ = ["Engine", "StepOutput", "check_options", "check_prompt", "max_positions"]


class StepOutput(NamedTuple):
    """One step's result for one sequence: the token it produced, and whether it just finished (a named tuple:
    a step builds one per sequence, and a frozen dataclass costs several times as much to build).

    `logprob` (the token's log-probability) and `top_logprobs` (``(token, logprob)`` pairs, most likely first)
    are set when the request asks for logprobs (`SamplingParams.logprobs`), from the model's raw logits.
    """

    seq: Sequence
    token: int
    finished: bool
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


class Engine:
    """A loaded model with its cache, scheduler and runner.

    Attributes:
        plan: the gate plan (which implementation serves each operator problem).
        cache: the paged `KVCache`, or a recurrent model's `StatePool`.
        runner: the `AttentionRunner` or `RecurrentRunner` over `cache`.
        ranks: this process's rank of a tensor-parallel run (`infinilm.distributed.launch.Ranks`), None alone.
        graph_status: whether decode steps (and, for a recurrent model with `prefill_graph_lengths`, lone-prompt
            prefills) run as CUDA graphs, and why not when they do not (naming an implementation that
            synchronizes with the host).
        warmup: what the build's tuning and warm-up of the buckets it runs did (`infinilm.engine.warmup`).
        rows: the running sequences' persistent step inputs (`infinilm.engine.input_batch.SeqRows`).
        async_scheduling: whether steps overlap (`infinilm.engine.overlap`): ``EngineOptions.async_scheduling``,
            by default on CUDA; may be switched while the engine is idle (a benchmark compares both on one engine).
        cpu_threads / threads_status: on the CPU, the intra-op thread count the engine's calls run at (None:
            the caller's) and a line saying why (calibrated on its decode step, or the user's:
            `infinilm.engine.threads`); on CUDA, None and empty.
        prefill_tokens / decode_tokens / prefill_seconds / decode_seconds: counters for throughput reports.
    """

    def __init__(self, config: ModelConfig, options: EngineOptions, gate_plan: GatePlan, model: CausalLM, *,
                 ranks: Ranks | None = None) -> None:
        """Allocate the cache of `model` (loaded) and capture CUDA graphs when the options ask for them; `ranks`:
        this process's rank when `model` is its shard (``gate_plan.parallel``), whose cache holds its heads and
        as many blocks as every rank's has.

        Raises:
            ConfigError: `check_options` refuses the options; the cache does not fit the memory available now.
        """
        check_options(config, options)
        self.config, self.options, self.plan, self.model, self.ranks = config, options, gate_plan, model, ranks
        self.device = torch.device(options.device)
        tp = gate_plan.parallel
        self.cache = cache_class(config).for_engine(config if tp is None else tp.local_config(config), options,
                                                    self.device)
        if ranks is not None:  # every rank's block ids must exist on every rank
            weakref.finalize(self, ranks.close)  # an engine dropped unclosed still stops its ranks
            agreed = ranks.agree(self.cache.allocator.num_blocks)
            if agreed < self.cache.allocator.num_blocks:
                self.cache.allocator = BlockAllocator(agreed, self.cache.allocator.block_size)
        self.runner: Runner
        recurrent = isinstance(self.cache, StatePool)
        self.rows = SeqRows(options.max_num_seqs, 1 if recurrent else options.blocks_per_seq(config),
                            self.cache.allocator.block_size, self.device)
        if isinstance(self.cache, StatePool):
            self.runner = RecurrentRunner(model, self.cache, self.device, self.rows)
        else:
            self.runner = AttentionRunner(model, self.cache, self.device, self.rows)
        self.scheduler = Scheduler(self.cache.allocator, max_num_seqs=options.max_num_seqs,
                                   max_num_batched_tokens=options.max_num_batched_tokens,
                                   max_model_len=options.model_len(config), eos_token_ids=config.eos_token_ids,
                                   rows=self.rows)
        self.cpu_threads: int | None = None  # the caller's, until the calibration below
        self.graph_status = "cuda graphs: off (not on CUDA)" if self.device.type != "cuda" else "cuda graphs: off"
        with self._scope():  # tune and warm the buckets it will run, before the graphs capture the winners
            self.warmup: WarmupReport = warm_up(self, progress=options.progress)
        self.threads_status = ""
        if self.device.type == "cpu" and ranks is None:
            most = min(options.max_num_seqs, self.cache.allocator.num_blocks, 64)
            small, large = decode_padding(self, 1), decode_padding(self, most)
            with self._scope():
                self.cpu_threads, self.threads_status = calibrate_threads(lambda: (small(), large()))
        elif self.device.type == "cpu":  # each rank timing on its own could run different collectives
            self.threads_status = f"cpu threads: {torch.get_num_threads()} (not calibrated under tensor parallelism)"
        used = [*gate_plan.chosen.values(), *self.warmup.chosen.values()]
        if self.device.type == "cuda" and options.cuda_graphs:
            with self._scope():
                self.graph_status = self.runner.capture_graphs(options.max_num_seqs, used)
                if options.prefill_graph_lengths:
                    self.graph_status += "; " + self.runner.capture_prefill_graphs(options.prefill_graph_lengths,
                                                                                  used)
        self.prefill_tokens = self.decode_tokens = 0
        self.prefill_seconds = self.decode_seconds = 0.0
        self._request_ids = itertools.count()
        self._in_flight: InFlight | None = None
        self._resolved_at = 0.0
        self._async = False
        self._host_ids = HostIds(0, self.device)
        self.async_scheduling = options.schedules_async(self.device) and ranks is None

    @property
    def async_scheduling(self) -> bool:
        """Whether steps overlap (see the class's attributes)."""
        return self._async

    @async_scheduling.setter
    def async_scheduling(self, on: bool) -> None:
        """Raises: RuntimeError: the engine has work (switch it while idle). ConfigError: on, for a
        tensor-parallel rank (`EngineOptions.async_scheduling`)."""
        if on == self._async:
            return
        if self.has_work():
            raise RuntimeError("async_scheduling: switch it while the engine is idle (requests are in flight)")
        if on and self.ranks is not None:
            raise ConfigError("async_scheduling: not under tensor parallelism (the ranks would need the sampled ids)")
        self._async = bool(on)
        if on:
            self._host_ids = HostIds(self.options.max_num_seqs, self.device)

    @property
    def status(self) -> str:
        """One line: `graph_status`, ``async scheduling: on`` when it is, and `threads_status` on the CPU."""
        overlap = "async scheduling: on" if self.async_scheduling else ""
        return "; ".join(filter(None, (self.graph_status, overlap, self.threads_status)))

    @classmethod
    def from_pretrained(cls, path: str | Path, options: EngineOptions | None = None) -> Engine:
        """Gate, allocate and load a checkpoint directory.

        With ``options.tensor_parallel_size > 1`` this process becomes rank 0 and starts the other ranks (or joins
        the run torchrun's variables name; see `infinilm.distributed.launch`) after the gates and the header check.

        Raises:
            ConfigError: an unsupported config or option, a model that does not split across
                ``tensor_parallel_size`` ranks. GateError: an operator problem no provider serves (raised before
                any weight is read or any rank starts). LoadError: the checkpoint cannot be read safely or does not
                fit the model (raised from the safetensors headers, before the model is allocated).
                FollowerError: another rank failed (its error).
        """
        options = options or EngineOptions()
        config = read_config(path)
        check_options(config, options)
        gate_plan = plan(config, options)
        size = options.tensor_parallel_size
        first = gate_plan if size == 1 else dataclasses.replace(gate_plan, parallel=TensorParallel(size))
        checkpoint = cls.check_checkpoint(path, config, options, first)
        if size == 1:
            model = cls._build(config, options, gate_plan)
            ignored = functools.partial(family_of(config.model_type).model.ignored, tied=config.tie_word_embeddings)
            load_weights(checkpoint, model.targets(), ignored=ignored, progress=options.progress)
            return cls(config, options, gate_plan, model)
        ranks = join(options, _follow, (str(path), options))
        with ranks.guard():  # a failure closes the run; a follower's error explains a collective that failed here
            options, gate_plan = ranks.options(options), dataclasses.replace(gate_plan, parallel=ranks.layout)
            model = cls._build(config, options, gate_plan)
            ignored = functools.partial(family_of(config.model_type).model.ignored, tied=config.tie_word_embeddings)
            load_weights(checkpoint, model.targets(), ignored=ignored, progress=options.progress)
            ranks.loaded()
            return cls(config, options, gate_plan, model, ranks=ranks)

    @classmethod
    def check_checkpoint(cls, path: str | Path, config: ModelConfig, options: EngineOptions,
                         gate_plan: GatePlan) -> Checkpoint:
        """Read the checkpoint's index and safetensors headers (names, shapes, dtypes) and compare them with
        the tensors of the model built on the meta device; reads no tensor data and allocates nothing.

        This is what `from_pretrained` checks before it allocates the model, and what ``infinilm check`` runs
        after the gates.

        Raises:
            LoadError: every problem `infinilm.engine.loader.read_checkpoint` (the files, the index, the
                headers) and `infinilm.engine.loader.Checkpoint.check` (missing, unexpected, mis-shaped or
                not floating-point tensors) find, naming the file.
        """
        ignored = functools.partial(family_of(config.model_type).model.ignored, tied=config.tie_word_embeddings)
        checkpoint = read_checkpoint(path)
        checkpoint.check(cls._build(config, options, gate_plan, torch.device("meta")).targets(), ignored)
        return checkpoint

    @staticmethod
    def _build(config: ModelConfig, options: EngineOptions, gate_plan: GatePlan,
               device: torch.device | None = None) -> CausalLM:
        """The family's model with empty weights on `device` (default: the options' device; ``meta`` allocates
        nothing)."""
        return family_of(config.model_type).model(config, gate_plan, dtype=options.resolved_dtype(config),
                                                  device=device or torch.device(options.device),
                                                  max_len=options.model_len(config))

    def _ranks_guard(self) -> contextlib.AbstractContextManager[None]:
        """Rank 0 of a tensor-parallel run: `Ranks.guard` (a failed step ends the run and raises the follower's
        error); nothing alone."""
        return self.ranks.guard() if self.ranks is not None else contextlib.nullcontext()

    def _scope(self) -> contextlib.AbstractContextManager[None]:
        """The provider overrides, unchecked index mode when the options ask for it, and the CPU thread count the
        engine chose (`infinilm.engine.threads`); a shared no-op scope when none of them changes anything (the
        common step: three nested scopes cost a tenth of a batch-64 step's host time)."""
        threads = self.cpu_threads
        if (not self.options.providers and self.options.checks_indices(self.device)
                and (threads is None or threads == torch.get_num_threads())):
            return _NO_SCOPE
        return self._full_scope()

    @contextlib.contextmanager
    def _full_scope(self) -> Iterator[None]:
        """`_scope` when something changes."""
        with overrides(self.options), using_threads(self.cpu_threads), \
                contextlib.ExitStack() as stack:
            if not self.options.checks_indices(self.device):
                stack.enter_context(unchecked_indices())
            yield

    # -- requests ------------------------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: SamplingParams | None = None) -> Sequence:
        """Queue a prompt (token ids); returns its `Sequence`, which fills as steps run.

        Raises:
            ValueError: an empty prompt, a token id that is not an integer or is outside the vocabulary, or a
                prompt that can never fit.
        """
        seq = Sequence(check_prompt(prompt, self.config.vocab_size), params or SamplingParams(),
                       next(self._request_ids))
        self.scheduler.add(seq)
        return seq

    def cancel(self, seq: Sequence) -> bool:
        """Cancel a request between steps and free its KV blocks (or state row; under async scheduling once the
        step in flight is read, and the token it computes for the request is dropped); False when it had already
        finished."""
        return self.scheduler.cancel(seq, in_flight=self._in_flight is not None)

    def has_work(self) -> bool:
        """Whether a request is waiting or running, or a step is in flight."""
        return self.scheduler.has_work() or self._in_flight is not None

    # -- the data path -------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """Schedule -> prepare inputs -> run model -> sample -> postprocess; one token per scheduled sequence.

        Under async scheduling the tokens are those of the step launched by the call before (or, when none is in
        flight, of the step this call launches first), and the next step is launched before they are read
        (`infinilm.engine.overlap`); a token computed for a request that had finished is dropped.

        Raises:
            FollowerError: a tensor-parallel follower failed or died in the step (or did before: the run has
                ended, and every later step raises it again).
        """
        if self.async_scheduling:
            return self._step_async()
        self.rows.writable()  # the last step's copies are done (its sampled ids were read): no wait
        batch = self.scheduler.schedule()
        if not batch:
            return []
        start = time.perf_counter()
        seqs = batch.seqs
        batch.rows = SeqRows.rows_of(seqs)
        with self._scope(), self._ranks_guard():
            if self.ranks is not None:
                self.ranks.send(StepKind.RUN, batch)
            logits = self.runner.run(batch)
        tokens = sample(logits, seqs)
        lps = logprobs(logits, seqs, tokens)
        self.rows.advance(batch.rows, tokens)
        self._count(batch, time.perf_counter() - start)
        return _outputs(seqs, tokens, self.scheduler.postprocess(batch, tokens), lps)

    def _count(self, batch: Batch, seconds: float, decodes: int | None = None) -> None:
        """Count `batch` (`decodes`: the decode tokens it produced, None: one per decode sequence)."""
        if batch.prefills:
            self.prefill_tokens += sum(len(s) for s in batch.prefills)
            self.prefill_seconds += seconds
        else:
            self.decode_tokens += len(batch.decodes) if decodes is None else decodes
            self.decode_seconds += seconds

    def _step_async(self) -> list[StepOutput]:
        """`step` under async scheduling: launch the next step, then read and postprocess the one before."""
        try:
            done = self._in_flight or self._launch(pending=False)
            if done is None:
                return []
            self._in_flight = None
            if done.overlap and self.scheduler.can_continue():
                self._in_flight = self._launch(pending=True)
            return self._resolve(done)
        except BaseException:
            self._in_flight = None  # the steps in flight are lost: their requests are left to cancel
            self.rows.resolved(np.empty(0, dtype=np.int64), [], latest=True)
            self.scheduler.release_deferred(self.scheduler.take_deferred())
            raise

    def _launch(self, *, pending: bool) -> InFlight | None:
        """Schedule a step (`pending`: a step is in flight whose ids are not read) and launch it, its sampled ids
        left on the device; None when nothing can be scheduled."""
        self.rows.writable()
        batch = self.scheduler.schedule(pending)
        if not batch:
            return None
        start = time.perf_counter()
        batch.rows = SeqRows.rows_of(batch.seqs)
        with self._scope():
            logits = self.runner.run(batch)
        ids = sample_ids(logits, batch.seqs)
        self.rows.launched(batch.rows, ids)
        return InFlight(batch, ids, logits, self._host_ids.take(), start)

    def _resolve(self, done: InFlight) -> list[StepOutput]:
        """Read the ids of `done`, postprocess them and free what finished while it was in flight; the outputs
        of its requests that had not finished before."""
        tokens = done.tokens()
        batch, latest = done.batch, self._in_flight is None
        self.rows.resolved(batch.rows, tokens, latest)
        late = self.scheduler.take_deferred()  # finished while `done` was in flight: this token is dropped
        live = [s.status is not SeqStatus.FINISHED for s in batch.seqs]
        lps = logprobs(done.logits, batch.seqs, tokens) if done.logits is not None else None
        finished = self.scheduler.postprocess(batch, tokens, in_flight=not latest)
        self.scheduler.release_deferred(late)
        out = _outputs(batch.seqs, tokens, finished, lps, live)
        now = time.perf_counter()
        self._count(batch, now - max(done.start, self._resolved_at), sum(live[:len(batch.decodes)]))
        self._resolved_at = now
        return out

    def stream(self) -> Iterator[StepOutput]:
        """Run steps until every request has finished, yielding each produced token."""
        while self.has_work():
            yield from self.step()

    def generate(self, prompts: Iterable[list[int]], params: SamplingParams | None = None) -> list[list[int]]:
        """Run `prompts` to completion together; returns each one's generated tokens, in order."""
        seqs = [self.add_request(p, params) for p in prompts]
        for _ in self.stream():
            pass
        return [s.output for s in seqs]

    def prefill_logits(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """Logits ``[len(p), V]`` at every position of each prompt, in one batched prefill.

        Uses (and frees) KV blocks; call it while no request is running.

        Raises:
            ValueError: no prompt, an empty prompt, a token id that is not an integer or is outside the
                vocabulary, or a prompt longer than ``max_model_len`` (the positions the model was built for;
                raised before any kernel runs). RuntimeError: requests are in flight. CacheError: the prompts
                need more blocks than are free. FollowerError: as `step`.
        """
        if not prompts:
            raise ValueError("prompts: needs at least one prompt")
        prompts = [check_prompt(p, self.config.vocab_size, f"prompts[{i}]") for i, p in enumerate(prompts)]
        limit = self.options.model_len(self.config)
        for i, p in enumerate(prompts):
            if len(p) > limit:
                raise ValueError(f"prompts[{i}]: {len(p)} tokens exceed max_model_len={limit} (the longest "
                                 "sequence this engine was built for)")
        if self.has_work():
            raise RuntimeError("prefill_logits needs an idle engine")
        seqs = [Sequence(p, SamplingParams()) for p in prompts]
        alloc = self.cache.allocator
        try:
            for s in seqs:
                alloc.append(s.block_table, len(s))
            with self._scope(), self._ranks_guard():
                if self.ranks is not None:
                    self.ranks.send(StepKind.PREFILL_LOGITS, Batch(prefills=seqs))
                logits = self.runner.prefill_logits(Batch(prefills=seqs))
        finally:
            for s in seqs:
                alloc.free(s.block_table)
        return list(logits.split([len(p) for p in prompts]))

    # -- tensor parallelism --------------------------------------------------------------------------
    def follow(self) -> None:
        """A follower rank (rank > 0): run each step rank 0 broadcasts, until it broadcasts the stop (its
        `close`); then close this rank.

        Raises:
            RuntimeError: this engine is not a follower rank.
        """
        if self.ranks is None or self.ranks.leader:
            raise RuntimeError("follow: only a follower rank (rank > 0 of a tensor-parallel run) follows rank 0")
        try:
            while True:
                kind, batch = self.ranks.receive()
                if batch is None:
                    break
                with self._scope():
                    if kind is StepKind.RUN:
                        self.rows.writable()
                        self.rows.mirror(batch)
                        self.runner.run(batch)
                    else:
                        self.runner.prefill_logits(batch)
        finally:
            self.close()

    def close(self) -> None:
        """End a tensor-parallel run (rank 0 stops the other ranks and waits for them) and free the process group;
        nothing for an engine of one process. Idempotent; the engine runs no step afterwards."""
        if self.ranks is not None:
            self.ranks.close()

    def __enter__(self) -> Engine:
        """The engine itself; `close` runs when the block ends."""
        return self

    def __exit__(self, *exc: object) -> None:
        """`close` (an exception in the block propagates)."""
        self.close()


_NO_SCOPE = contextlib.nullcontext()
_new_output = functools.partial(tuple.__new__, StepOutput)  # StepOutput(*fields) without its Python-level __new__


def _outputs(seqs: list[Sequence], tokens: list[int], finished: list[Sequence],
             lps: list[tuple[float, tuple[tuple[int, float], ...]] | None] | None,
             keep: list[bool] | None = None) -> list[StepOutput]:
    """The step's `StepOutput` of each of `seqs` (with `keep`: those where it is True), `finished` being those that
    just finished and `lps` each one's logprobs or None (None: no row has any); built by C-level iteration when no
    row has logprobs."""
    done = {s.id for s in finished}
    flags: Iterable[bool] = [s.id in done for s in seqs] if done else itertools.repeat(False)
    if lps is not None and any(lps):
        fields: Iterable[tuple[object, ...]] = ((s, t, f, *(lp or (None, ())))
                                                for s, t, f, lp in zip(seqs, tokens, flags, lps))
    else:
        fields = zip(seqs, tokens, flags, itertools.repeat(None), itertools.repeat(()))
    if keep is not None:
        fields = itertools.compress(fields, keep)
    return list(map(_new_output, fields))


def _follow(path: str, options: EngineOptions) -> None:
    """A follower rank started by rank 0: load this rank's shard (after the same checks and gates as rank 0),
    then run rank 0's steps until it stops."""
    Engine.from_pretrained(path, options).follow()
