"""Gates before loading: the operator problems a configuration needs, resolved at once.

From the model config and the engine options (device, dtype, block size, provider overrides), `plan`
lists every ``(operator, problem)`` the model will call and resolves them with
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from infinilm.config import EngineOptions, ModelConfig
from infiniops_py import GateError, Implementation, Problem, explain, make_problem, resolve_closure, use
from infiniops_py.operators._base import dtype_name

__all__ = ["GatePlan", "gate_report", "overrides", "parse_provider_overrides", "plan"]

_REFERENCE = "reference"


@dataclass(frozen=True)
class GatePlan:
    """What the gates decided: the two path choices and the implementation of every problem.

    Attributes:
        fused_qk_norm: Qwen3 q/k norms through `fused_qk_norm` (else per-head `rms_norm`).
        fused_bias: linear biases fused into `gemm` (else `gemm` + `add`).
        chosen: each problem the model needs -> the implementation that serves it.
    """

    fused_qk_norm: bool = False
    fused_bias: bool = True
    chosen: dict[Problem, Implementation] = field(default_factory=dict)

    def providers_by_op(self) -> dict[str, str]:
        """Operator -> the provider(s) serving its problems (``torch``, or ``torch+triton`` when split)."""
        names: dict[str, list[str]] = {}
        for problem, impl in self.chosen.items():
            seen = names.setdefault(problem.op, [])
            if impl.provider not in seen:
                seen.append(impl.provider)
        return {op: "+".join(p) for op, p in names.items()}

    def render(self) -> str:
        """The closure as a table: operator, problem fields, implementation."""
        lines = [f"{'operator':<26} {'implementation':<34} problem"]
        for problem, impl in self.chosen.items():
            fields = ", ".join(f"{k}={v}" for k, v in problem.fields.items())
            lines.append(f"{problem.op:<26} {impl.name:<34} {problem.dtype}, {problem.device_type}: {fields}")
        lines.append(f"qk norm: {'fused_qk_norm' if self.fused_qk_norm else 'per-head rms_norm'}; "
                     f"linear bias: {'fused into gemm' if self.fused_bias else 'gemm + add'}")
        return "\n".join(lines)


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


def _device_type(device: str) -> str:
    return torch.device(device).type


def _served(op: str, **fields: Any) -> bool:
    """Whether a provider other than the last-resort reference would serve this problem."""
    chosen = explain(op, **fields).chosen
    return chosen is not None and chosen.provider != _REFERENCE


def _base(c: ModelConfig, o: EngineOptions) -> dict[str, Any]:
    return {"device_type": _device_type(o.device), "dtype": dtype_name(o.resolved_dtype(c))}


_GEMM = {"batched": False, "trans_a": False, "trans_b": True, "has_c": False}


def _problems(c: ModelConfig, o: EngineOptions, fused_qk: bool, fused_bias: bool) -> list[tuple[str, dict[str, Any]]]:
    base = _base(c, o)
    d, bs, gqa = c.head_dim, o.block_size, c.num_heads // c.num_kv_heads
    biases = {c.qkv_bias, c.o_bias, c.mlp_bias}
    out: list[tuple[str, dict[str, Any]]] = [("gemm", {**base, **_GEMM, "has_bias": False})]
    if True in biases:
        if fused_bias:
            out.append(("gemm", {**base, **_GEMM, "has_bias": True}))
        else:
            out.append(("add", {**base, "broadcast": True, "inplace": True}))
    out.append(("rms_norm", {**base, "hidden_size": c.hidden_size}))
    out.append(("fused_add_rms_norm", {**base, "hidden_size": c.hidden_size}))
    if c.qk_norm:
        if fused_qk:
            out.append(("fused_qk_norm", {**base, "head_dim": d, "num_q_heads": c.num_heads,
                                          "num_kv_heads": c.num_kv_heads}))
        else:
            out.append(("rms_norm", {**base, "hidden_size": d}))
    out.append(("reshape_and_cache_flash", {**base, "head_dim": d, "block_size": bs, "num_kv_heads": c.num_kv_heads}))
    attn = {**base, "head_dim": d, "gqa_ratio": gqa, "causal": True, "local": False, "softcap": False}
    out.append(("flash_attn_varlen", {**attn, "paged": False, "block_size": 0}))
    out.append(("flash_attn_with_kvcache", {**attn, "paged": True, "block_size": bs, "append": False}))
    return out


def plan(config: ModelConfig, options: EngineOptions) -> GatePlan:
    """Resolve every operator problem of `config` under `options`; reads no weights.

    Raises:
        GateError: one error listing every problem that no (allowed) provider can serve.
    """
    base = _base(config, options)
    with overrides(options):
        if options.qk_norm == "auto":
            fused_qk = config.qk_norm and _served(
                "fused_qk_norm", **base, head_dim=config.head_dim, num_q_heads=config.num_heads,
                num_kv_heads=config.num_kv_heads)
        else:
            fused_qk = config.qk_norm and options.qk_norm == "fused"
        fused_bias = _served("gemm", **base, **_GEMM, has_bias=True)
        if config.ssm is not None:  # Mamba-2: no attention; conv, scans and the per-group gated norm
            from infinilm.models.mamba2 import gate_problems

            requests = gate_problems(config, base, fused_bias)
        else:
            requests = _problems(config, options, fused_qk, fused_bias)
        problems = list(dict.fromkeys(make_problem(op, **fields) for op, fields in requests))
        chosen = resolve_closure(problems)
    return GatePlan(fused_qk_norm=fused_qk, fused_bias=fused_bias, chosen=chosen)


def gate_report(err: GateError) -> str:
    """The gate error as printed by the CLI."""
    return f"gate check failed: this configuration cannot run\n{err.render()}"
