"""Gates before loading: the operator problems a configuration needs, resolved at once.

From the model config and the engine options (device, dtype, block size, provider overrides), `plan`
takes every ``(operator, problem)`` the config's family declares its model calls and resolves them with
`infiniops_py.resolve_closure`, before any weight is read: an unsupported combination raises one
`GateError` listing every gap. Two choices are made here, each from what the providers serve:

- Qwen3's q/k norm: `fused_qk_norm` when a provider other than the last-resort ``reference`` serves it
  for this device, dtype and head dim (or when forced with ``qk_norm="fused"``), else two per-head
  `rms_norm` calls over ``head_dim``.
- Linear bias: Gemm with the bias fused (``has_bias=True``) when a non-reference provider serves it, else
  Gemm then an in-place broadcast `add`.

Provider overrides (``--provider OP=NAME``) apply as `infiniops_py.use` scopes, both here and while the
engine runs (`overrides`), so the gates check exactly what will run.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any, Final

import torch

from infinilm.config import EngineOptions, ModelConfig
from infinilm.models.family import GEMM_FIELDS, GatePlan
from infinilm.models.registry import family_of
from infiniops_py import GateError, explain, make_problem, resolve_closure, use
from infiniops_py.operators._base import dtype_name

__all__ = ["GatePlan", "gate_report", "overrides", "parse_provider_overrides", "plan", "problem_base"]

_REFERENCE: Final = "reference"


def parse_provider_overrides(items: list[str] | tuple[str, ...]) -> tuple[tuple[str | None, str], ...]:
    """``["flash_attn_varlen=triton", "torch"]`` -> ``(("flash_attn_varlen", "triton"), (None, "torch"))``.

    Raises:
        ValueError: an empty operator or provider name.
    """
    out: list[tuple[str | None, str]] = []
    for item in items:
        op, sep, name = item.partition("=")
        op, name = (op.strip(), name.strip()) if sep else ("", op.strip())
        if not name or (sep and not op):
            raise ValueError(f"--provider {item!r}: expected OP=NAME or NAME")
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


def problem_base(config: ModelConfig, options: EngineOptions) -> dict[str, Any]:
    """The fields every problem of `config` under `options` shares: ``device_type`` and the ``dtype`` name."""
    return {"device_type": torch.device(options.device).type, "dtype": dtype_name(options.resolved_dtype(config))}


def plan(config: ModelConfig, options: EngineOptions) -> GatePlan:
    """Resolve every operator problem the family of `config` declares under `options`; reads no weights.

    Raises:
        ConfigError: no family serves ``config.model_type``.
        GateError: one error listing every problem that no (allowed) provider can serve.
    """
    family = family_of(config.model_type)
    base = problem_base(config, options)
    with overrides(options):
        if options.qk_norm == "auto":
            fused_qk = config.qk_norm and _served(
                "fused_qk_norm", **base, head_dim=config.head_dim, num_q_heads=config.num_heads,
                num_kv_heads=config.num_kv_heads)
        else:
            fused_qk = config.qk_norm and options.qk_norm == "fused"
        choices = GatePlan(fused_qk_norm=fused_qk, fused_bias=_served("gemm", **base, **GEMM_FIELDS, has_bias=True))
        requests = family.gate_problems(config, options, base, choices)
        problems = list(dict.fromkeys(make_problem(op, **fields) for op, fields in requests))
        chosen = resolve_closure(problems)
    return dataclasses.replace(choices, chosen=chosen)


def gate_report(err: GateError) -> str:
    """The gate error as printed by the CLI."""
    return f"gate check failed: this configuration cannot run\n{err.render()}"
