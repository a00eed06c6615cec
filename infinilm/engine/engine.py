"""The engine: gates, load, then one straight data path per step.

``Engine.from_pretrained`` reads the config, runs the gates (`infinilm.engine.gates.plan`, which raises
`GateError` before any weight is read), checks the checkpoint's safetensors headers against the model's
tensors (`infinilm.engine.loader`, before anything is allocated), allocates the model and loads the weights, then
sizes the paged KV cache (for a recurrent Mamba-2 model: the state pool of `infinilm.engine.state_pool`, one row per
running request, and its `RecurrentRunner`). Each `step` is: schedule -> prepare inputs -> run model -> sample ->
postprocess. Requests can be added and cancelled between steps; new prefills join the running decodes in the
next step.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from infinilm.config import ConfigError, EngineOptions, ModelConfig
from infinilm.engine.gates import GatePlan, overrides, plan
from infinilm.engine.kv_cache import KVCache, check_fits
from infinilm.engine.loader import load_weights, read_checkpoint
from infinilm.engine.runner import ModelRunner
from infinilm.engine.sampling import sample
from infinilm.engine.scheduler import Batch, Scheduler
from infinilm.engine.sequence import SamplingParams, Sequence
from infinilm.engine.state_pool import RecurrentRunner, StatePool
from infinilm.models.llama import LlamaModel
from infinilm.models.mamba2 import Mamba2Model
from infiniops_py import unchecked_indices

__all__ = ["Engine", "StepOutput", "check_options", "check_prompt", "max_positions"]


@dataclass(frozen=True)
class StepOutput:
    """One step's result for one sequence: the token it produced, and whether it just finished."""

    seq: Sequence
    token: int
    finished: bool


class Engine:
    """A loaded model with its KV cache, scheduler and runner.

    Attributes:
        plan: the gate plan (which implementation serves each operator problem).
        graph_status: whether decode steps (and, for Mamba-2 with `prefill_graph_lengths`, lone-prompt prefills) run
            as CUDA graphs, and why not when they do not (naming an implementation that synchronizes with the host).
        prefill_tokens / decode_tokens / prefill_seconds / decode_seconds: counters for throughput reports.
    """

    def __init__(self, config: ModelConfig, options: EngineOptions, gate_plan: GatePlan,
                 model: LlamaModel | Mamba2Model) -> None:
        _check_prefill_graphs(config, options)
        self.config, self.options, self.plan, self.model = config, options, gate_plan, model
        self.device = torch.device(options.device)
        dtype = options.resolved_dtype(config)
        self.cache: KVCache | StatePool
        self.runner: ModelRunner | RecurrentRunner
        if isinstance(model, Mamba2Model):  # recurrent: one state row per request, no KV blocks
            self.cache = StatePool.for_engine(config, options, self.device)
            self.runner = RecurrentRunner(model, self.cache, self.device)
        else:
            num_blocks = options.num_blocks or self._auto_blocks(dtype)
            _check_blocks(config, options, num_blocks)
            _check_cache_memory(config, options, num_blocks, self.device, now=True)
            self.cache = KVCache(config.num_layers, num_blocks, options.block_size, config.num_kv_heads,
                                 config.head_dim, dtype, self.device)
            self.runner = ModelRunner(model, self.cache, self.device, options.blocks_per_seq(config))
        self.scheduler = Scheduler(self.cache.allocator, max_num_seqs=options.max_num_seqs,
                                   max_num_batched_tokens=options.max_num_batched_tokens,
                                   max_model_len=options.model_len(config), eos_token_ids=config.eos_token_ids)
        self.graph_status = "cuda graphs: off (not on CUDA)" if self.device.type != "cuda" else "cuda graphs: off"
        if self.device.type == "cuda" and options.cuda_graphs:
            with self._scope():
                self.graph_status = self.runner.capture_graphs(options.max_num_seqs, gate_plan.chosen.values())
                if isinstance(self.runner, RecurrentRunner) and options.prefill_graph_lengths:
                    self.graph_status += "; " + self.runner.capture_prefill_graphs(
                        options.prefill_graph_lengths, gate_plan.chosen.values())
        self.prefill_tokens = self.decode_tokens = 0
        self.prefill_seconds = self.decode_seconds = 0.0

    @classmethod
    def from_pretrained(cls, path: str | Path, options: EngineOptions | None = None) -> Engine:
        """Gate, allocate and load a checkpoint directory.

        Raises:
            ConfigError: an unsupported config or option. GateError: an operator problem no provider serves
                (raised before any weight is read). LoadError: the checkpoint cannot be read safely or does not
                fit the model (raised from the safetensors headers, before the model is allocated).
        """
        options = options or EngineOptions()
        config = ModelConfig.from_pretrained(path)
        check_options(config, options)
        gate_plan = plan(config, options)
        # the headers (names, shapes, dtypes) against the model's targets built on the meta device: a
        # checkpoint that does not fit is refused before any weight is allocated or read
        family = Mamba2Model if config.ssm is not None else LlamaModel
        ignored = functools.partial(family.ignored, tied=config.tie_word_embeddings)
        checkpoint = read_checkpoint(path)
        checkpoint.check(cls._build(config, options, gate_plan, torch.device("meta")).targets(), ignored)
        model = cls._build(config, options, gate_plan)
        load_weights(checkpoint, model.targets(), ignored=ignored, progress=options.progress)
        return cls(config, options, gate_plan, model)

    @staticmethod
    def _build(config: ModelConfig, options: EngineOptions, gate_plan: GatePlan,
               device: torch.device | None = None) -> LlamaModel | Mamba2Model:
        """The model with empty weights on `device` (default: the options' device; ``meta`` allocates nothing)."""
        dtype, device = options.resolved_dtype(config), device or torch.device(options.device)
        if config.ssm is not None:
            return Mamba2Model(config, gate_plan, dtype=dtype, device=device)
        return LlamaModel(config, gate_plan, dtype=dtype, device=device, max_len=options.model_len(config))

    def _auto_blocks(self, dtype: torch.dtype) -> int:
        c, o = self.config, self.options
        per_block = KVCache.bytes_per_block(c.num_layers, o.block_size, c.num_kv_heads, c.head_dim, dtype)
        budget = o.kv_cache_memory
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = int(free - total * (1.0 - o.gpu_memory_utilization))
        cap = o.max_num_seqs * o.blocks_per_seq(c)  # more than every sequence at full length is never needed
        return max(1, min(cap, budget // per_block))

    @contextlib.contextmanager
    def _scope(self) -> Iterator[None]:
        """The provider overrides, and unchecked index mode when the options ask for it."""
        with overrides(self.options), contextlib.ExitStack() as stack:
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
        seq = Sequence(check_prompt(prompt, self.config.vocab_size), params or SamplingParams())
        self.scheduler.add(seq)
        return seq

    def cancel(self, seq: Sequence) -> bool:
        """Cancel a request between steps and free its KV blocks (or state row); False when it had already finished."""
        return self.scheduler.cancel(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # -- the data path -------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """Schedule -> prepare inputs -> run model -> sample -> postprocess; one token per scheduled sequence."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        start = time.perf_counter()
        with self._scope():
            logits = self.runner.run(batch)
        tokens = sample(logits, batch.seqs)
        self._count(batch, time.perf_counter() - start)
        finished = {s.id for s in self.scheduler.postprocess(batch, tokens)}
        return [StepOutput(s, t, s.id in finished) for s, t in zip(batch.seqs, tokens)]

    def _count(self, batch: Batch, seconds: float) -> None:
        if batch.prefills:
            self.prefill_tokens += sum(len(s) for s in batch.prefills)
            self.prefill_seconds += seconds
        else:
            self.decode_tokens += len(batch.decodes)
            self.decode_seconds += seconds

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
            ValueError: no prompt, an empty prompt, or a token id that is not an integer or is outside the
                vocabulary. RuntimeError: requests are in flight. CacheError: the prompts need more blocks than
                are free.
        """
        if not prompts:
            raise ValueError("prompts: needs at least one prompt")
        prompts = [check_prompt(p, self.config.vocab_size, f"prompts[{i}]") for i, p in enumerate(prompts)]
        if self.has_work():
            raise RuntimeError("prefill_logits needs an idle engine")
        seqs = [Sequence(p, SamplingParams()) for p in prompts]
        alloc = self.cache.allocator
        try:
            for s in seqs:
                alloc.append(s.block_table, len(s))
            with self._scope():
                logits = self.runner.prefill_logits(Batch(prefills=seqs))
        finally:
            for s in seqs:
                alloc.free(s.block_table)
        return list(logits.split([len(p) for p in prompts]))


def check_prompt(prompt: Iterable[int], vocab_size: int, what: str = "prompt") -> list[int]:
    """`prompt` as a list of Python ints, each a token id in ``[0, vocab_size)``.

    An id is an ``int`` or an integer scalar with ``__index__`` (a NumPy integer, a 0-d integer tensor); a
    bool or a float (``1.7``) is refused, never truncated.

    Raises:
        ValueError: `prompt` is empty, or holds ids that are not integers or lie outside the vocabulary (the
            first five are named, after `what`).
    """
    ids: list[int] = []
    not_ints: list[object] = []
    for t in prompt:
        try:
            if isinstance(t, bool):
                raise TypeError
            ids.append(operator.index(t))
        except TypeError:
            not_ints.append(t)
    if not_ints:
        raise ValueError(f"{what}: token id(s) {not_ints[:5]} are not integers (a token id is an int in "
                         f"[0, {vocab_size}))")
    if not ids:
        raise ValueError(f"{what}: needs at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{what}: token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
    return ids


def max_positions(config: ModelConfig) -> int:
    """The longest sequence the model's positions serve: the bound of an explicit ``max_model_len``.

    As vLLM derives it: ``max_position_embeddings``, times the RoPE ``factor`` of ``linear`` and ``yarn``
    scaling (yarn: ``original_max_position_embeddings x factor`` when the config gives the original length);
    ``default`` and ``llama3`` RoPE configs list their full length. A recurrent (Mamba-2) model has no position
    table: its bound is `infinilm.models.mamba2.NO_POSITION_LIMIT`.
    """
    limit = config.max_position_embeddings
    hf = config.hf_config
    rope = (getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}) if hf is not None else {}
    factor = rope.get("factor")
    if config.rope_type in ("linear", "yarn") and isinstance(factor, int | float) and factor >= 1:
        original = rope.get("original_max_position_embeddings")
        if config.rope_type == "yarn" and isinstance(original, int):
            limit = original
        limit = int(limit * factor)
    return limit


def check_options(config: ModelConfig, options: EngineOptions) -> None:
    """The engine options checked against the model config, before the gates run and any weight is read.

    Raises:
        ConfigError: ``max_model_len`` beyond `max_positions`; a CUDA device index this machine does not have;
            ``num_blocks`` that cannot hold one sequence of ``max_model_len``; a KV cache (Mamba-2: a state
            pool) of ``num_blocks`` larger than the device's total memory, with the bytes it would need;
            ``prefill_graph_lengths`` for a model that is not recurrent.
    """
    limit = max_positions(config)
    if options.max_model_len is not None and options.max_model_len > limit:
        scaled = f" x its {config.rope_type} RoPE factor" if limit != config.max_position_embeddings else ""
        raise ConfigError(f"max_model_len={options.max_model_len} exceeds the {limit} positions this "
                          f"{config.model_type} model serves (max_position_embeddings="
                          f"{config.max_position_embeddings} in config.json{scaled}); lower max_model_len")
    device = torch.device(options.device)
    count = torch.cuda.device_count() if device.type == "cuda" and torch.cuda.is_available() else 0
    if count and device.index is not None and device.index >= count:
        raise ConfigError(f"device={options.device!r}: this machine has {count} CUDA device(s), cuda:0 .. "
                          f"cuda:{count - 1}")
    if options.num_blocks is not None:
        if config.ssm is None:
            _check_blocks(config, options, options.num_blocks)
        _check_cache_memory(config, options, options.num_blocks, device, now=False)
    _check_prefill_graphs(config, options)


def _check_cache_memory(config: ModelConfig, options: EngineOptions, num_blocks: int, device: torch.device, *,
                        now: bool) -> None:
    """Refuse a KV cache (Mamba-2: a state pool) of `num_blocks` blocks (rows) that does not fit `device`'s
    total memory (`now` False) or its available memory (`now` True), through `infinilm.engine.kv_cache.check_fits`."""
    dtype = options.resolved_dtype(config)
    if config.ssm is not None:
        from infinilm.engine.state_pool import state_bytes

        per_block, what = sum(state_bytes(config, dtype)), "state pool"
    else:
        per_block = KVCache.bytes_per_block(config.num_layers, options.block_size, config.num_kv_heads,
                                            config.head_dim, dtype)
        what = "KV cache"
    given = options.num_blocks is not None
    check_fits(f"{f'num_blocks={num_blocks}' if given else f'{num_blocks} blocks sized from the memory budget'}: "
               f"the {what} ({num_blocks} x {per_block} bytes)", num_blocks * per_block, device, now=now,
               fix="lower num_blocks" if given else "lower kv_cache_memory or gpu_memory_utilization")


def _check_blocks(config: ModelConfig, options: EngineOptions, num_blocks: int) -> None:
    per_seq = options.blocks_per_seq(config)
    if num_blocks < per_seq:
        raise ConfigError(f"num_blocks={num_blocks} cannot hold one sequence of max_model_len="
                          f"{options.model_len(config)} ({per_seq} blocks of {options.block_size}); "
                          f"lower max_model_len or give more blocks")


def _check_prefill_graphs(config: ModelConfig, options: EngineOptions) -> None:
    if options.prefill_graph_lengths and config.ssm is None:
        raise ConfigError(f"prefill_graph_lengths={options.prefill_graph_lengths}: prefill graphs serve recurrent "
                          f"(Mamba-2) models only, not {config.model_type}")
