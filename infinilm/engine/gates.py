"""Gates before loading: the operator problems a configuration needs, resolved at once.

From the model config and the engine options (device, dtype, block size, provider overrides), `plan`
makes the path choices below, traces the family's model forward on meta tensors with them
(`infinilm.engine.trace.traced_problems`: every problem its steps call, no weight read) and resolves those
problems with `infiniops_py.resolve_closure`, before any weight is read: an unsupported combination raises one
`GateError` listing every gap. These choices are made here, each from what the providers serve:

- Qwen3's q/k norm and RoPE: with ``qk_norm="auto"``, one `fused_qk_norm_rope` when a provider other than the
  last-resort ``reference`` serves it for this device, dtype and head layout; else the norms (`fused_qk_norm`
  when such a provider serves it, else two per-head `rms_norm` calls over ``head_dim``), then
  `rotary_embedding`. ``qk_norm="fused"`` forces `fused_qk_norm` and ``"per_head"`` the two `rms_norm`
  calls, each followed by `rotary_embedding`.
- Linear bias: Gemm with the bias fused (``has_bias=True``) when a non-reference provider serves it, else
  Gemm then an in-place broadcast `add`.
- A SwiGLU MLP's gate/up projection and activation: one `gemm_swiglu` when a non-reference provider serves it,
  else Gemm then `silu_and_mul`.
- A projection into the residual stream (o and down projections, Mamba-2's ``out_proj``) with the residual add
  and the next RMSNorm: one `gemm_add_rms_norm` when a non-reference provider serves it at the model's hidden size
  (with and without the projections' biases) and the model runs in one process, else Gemm then
  `fused_add_rms_norm`. A family whose layers norm each sub-block's output (Gemma 2, GLM-4) keeps the latter.
  With ``add_norm="prologue"`` instead, each norm goes into the prologue of the projection after it (one
  `rms_norm_gemm`: qkv, gate/up with SwiGLU, the LM head) and o and down add into the residual stream as the Gemm's
  ``c`` (Mamba-2: ``in_proj`` with the block's norm, ``out_proj`` with ``c``, the LM head with the final norm), when
  a non-reference provider serves all of those problems and the model runs in one process; else the separate
  path.

Provider overrides (``--provider OP=NAME``) apply as `infiniops_py.use` scopes, both here and while the
engine runs (`overrides`), so the gates check exactly what will run. An override naming an operator or a
provider the runtime does not know is an argument error (a typo, most likely), refused before anything
resolves, not a gate rejection. `gate_report` says a reason that alone rejects every candidate of every
problem (a ``cuda`` device on a machine without one) once, instead of once per problem.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any, Final

import torch

import infiniops_py
from infinilm.config import ConfigError, EngineOptions, ModelConfig
from infinilm.distributed.parallel import TensorParallel, check_split, parallel_problems
from infinilm.engine.trace import traced_problems
from infinilm.layers.rotary import qk_norm_rope_fields
from infinilm.models.family import GEMM_FIELDS, GatePlan
from infinilm.models.registry import family_of
from infiniops_py import GateError, explain, make_problem, providers, resolve_closure, use
from infiniops_py.problem import dtype_name

__all__ = ["GatePlan", "gate_report", "overrides", "parse_provider_overrides", "plan", "problem_base"]

_REFERENCE: Final = "reference"


def _override_problem(op: str | None, name: str) -> str | None:
    """What is wrong with the override ``(op, name)``: an operator `infiniops_py` does not define, or a provider
    it does not know (neither loaded nor failed to load: a typo, most likely), naming the known ones; None when
    both are known. A provider that failed to load is known: the gate report then says why it cannot serve."""
    if op is not None and op not in infiniops_py.OPERATORS:
        return f"unknown operator {op!r} (known: {', '.join(infiniops_py.OPERATORS)})"
    known = {p.name: p.loaded for p in providers()}
    if name not in known:
        return f"no provider is named {name!r} (known: {', '.join(sorted(n for n, ok in known.items() if ok))})"
    return None


def parse_provider_overrides(items: list[str] | tuple[str, ...]) -> tuple[tuple[str | None, str], ...]:
    """``["flash_attn_varlen=triton", "torch"]`` -> ``(("flash_attn_varlen", "triton"), (None, "torch"))``.

    Raises:
        ValueError: an empty operator or provider name, an operator `infiniops_py` does not define, or a
            provider name the runtime does not know (each naming ``--provider`` and the known names).
    """
    out: list[tuple[str | None, str]] = []
    for item in items:
        op, sep, name = item.partition("=")
        op, name = (op.strip(), name.strip()) if sep else ("", op.strip())
        if not name or (sep and not op):
            raise ValueError(f"--provider {item!r}: expected OP=NAME or NAME")
        problem = _override_problem(op or None, name)
        if problem is not None:
            raise ValueError(f"--provider {item!r}: {problem}")
        out.append((op or None, name))
    return tuple(out)


@contextlib.contextmanager
def overrides(options: EngineOptions) -> Iterator[None]:
    """Enter one `infiniops_py.use` scope per provider override, in order (later ones win)."""
    with contextlib.ExitStack() as stack:
        for op, name in options.providers:
            stack.enter_context(use(provider=name, op=op))
        yield


def _served(op: str, **fields: Any) -> bool:
    """Whether a provider other than the last-resort reference would serve this problem."""
    chosen = explain(op, **fields).chosen
    return chosen is not None and chosen.provider != _REFERENCE


def _residual_biases(config: ModelConfig) -> set[bool]:
    """Whether each projection into the residual stream has a bias: o and down (Mamba-2: ``out_proj``)."""
    return {config.ssm.use_bias} if config.ssm is not None else {config.o_bias, config.mlp_bias}


def _prologue_served(config: ModelConfig, base: dict[str, Any]) -> bool:
    """Whether non-reference providers serve the problems of the prologue path: the qkv projection, the gate/up
    projection with SwiGLU (Mamba-2: ``in_proj``) and the LM head as `rms_norm_gemm`, the o and down projections
    (Mamba-2: ``out_proj``) as `gemm` with ``c``."""
    if config.ssm is not None:
        norm_gemms = {(config.ssm.use_bias, False), (False, False)}
    else:
        norm_gemms = {(config.qkv_bias, False), (config.mlp_bias, True), (False, False)}
    return (all(_served("rms_norm_gemm", **base, has_bias=bias, swiglu=swiglu) for bias, swiglu in norm_gemms)
            and all(_served("gemm", **base, **{**GEMM_FIELDS, "has_c": True}, has_bias=bias)
                    for bias in _residual_biases(config)))


def problem_base(config: ModelConfig, options: EngineOptions) -> dict[str, Any]:
    """The fields every problem of `config` under `options` shares: ``device_type`` and the ``dtype`` name."""
    return {"device_type": torch.device(options.device).type, "dtype": dtype_name(options.resolved_dtype(config))}


def plan(config: ModelConfig, options: EngineOptions) -> GatePlan:
    """Resolve every operator problem the model of `config` calls under `options` (its forward traced on meta
    tensors); reads no weights.

    Split across ``options.tensor_parallel_size`` ranks, the problems are those of one rank's heads, KV heads and
    groups (`infinilm.distributed.parallel.TensorParallel.local_config`, the same on every rank), plus the
    collectives of the split (`infinilm.distributed.parallel.parallel_problems`).

    Raises:
        ConfigError: no family serves ``config.model_type``; a provider override (``options.providers``)
            names an operator or a provider the runtime does not know; ``options.tensor_parallel_size`` ranks
            that `config` cannot be split across (`infinilm.distributed.parallel.check_split`).
        GateError: one error listing every problem that no (allowed) provider can serve.
    """
    family_of(config.model_type)  # no family: a ConfigError before anything else
    check_split(config, options)
    full, config = config, TensorParallel(options.tensor_parallel_size).local_config(config)  # one rank's heads
    for i, (op, name) in enumerate(options.providers):
        problem = _override_problem(op, name)
        if problem is not None:
            raise ConfigError(f"providers[{i}]={(op, name)!r}: {problem}")
    base = problem_base(config, options)
    with overrides(options):
        fused_rope = False
        if options.qk_norm == "auto":
            fused_rope = config.qk_norm and _served(
                "fused_qk_norm_rope", **base, **qk_norm_rope_fields(config, config.num_heads, config.num_kv_heads))
            fused_qk = config.qk_norm and not fused_rope and _served(
                "fused_qk_norm", **base, head_dim=config.head_dim, num_q_heads=config.num_heads,
                num_kv_heads=config.num_kv_heads)
        else:
            fused_qk = config.qk_norm and options.qk_norm == "fused"
        choices = GatePlan(fused_qk_norm=fused_qk, fused_qk_norm_rope=fused_rope,
                           fused_bias=_served("gemm", **base, **GEMM_FIELDS, has_bias=True),
                           fused_swiglu=_served("gemm_swiglu", **base, has_bias=config.mlp_bias),
                           fused_add_norm=options.add_norm == "fused" and options.tensor_parallel_size == 1 and all(
                               _served("gemm_add_rms_norm", **base, has_bias=bias, hidden_size=config.hidden_size)
                               for bias in _residual_biases(config)),
                           prologue_norm=options.add_norm == "prologue" and options.tensor_parallel_size == 1
                           and _prologue_served(config, base))
        collectives = [make_problem(op, **fields) for op, fields in parallel_problems(full, options, base)]
        problems = list(dict.fromkeys([*traced_problems(config, options, choices), *collectives]))
        chosen = resolve_closure(problems)
    return dataclasses.replace(choices, chosen=chosen)


def _one_reason(err: GateError) -> str | None:
    """The reason that alone rejects every candidate of every problem of `err`, with its fixes (a fix that
    another one extends is left out), or None when the problems have other reasons too (or a candidate was
    excluded, or a problem has no candidate)."""
    rejections = [r for _, candidates in err.gaps for c in candidates for r in c.rejections]
    every = all(candidates and all(len(c.rejections) == 1 and not c.note for c in candidates)
                for _, candidates in err.gaps)
    if not every or len({r.reason() for r in rejections}) != 1:
        return None
    fixes = list(dict.fromkeys(r.fix for r in rejections if r.fix))
    fixes = [f for f in fixes if not any(g != f and g.startswith(f) for g in fixes)]
    return rejections[0].reason() + (f" (fix: {'; '.join(fixes)})" if fixes else "")


def gate_report(err: GateError) -> str:
    """The gate error as printed by the CLI: the full report, or, when several problems are all rejected for
    one reason alone (a ``cuda`` device on a machine without one), that reason once with the operators and
    providers it blocks."""
    head = "gate check failed: this configuration cannot run"
    reason = _one_reason(err) if len(err.gaps) > 1 else None
    if reason is None:
        return f"{head}\n{err.render()}"
    ops = ", ".join(dict.fromkeys(problem.op for problem, _ in err.gaps))
    names = ", ".join(dict.fromkeys(c.provider for _, candidates in err.gaps for c in candidates))
    lines = [head, *([err.headline] if err.headline else []),
             f"every candidate ({names}) of every problem ({ops}) is rejected for one reason:", f"  {reason}"]
    return "\n".join(lines)
