"""The capability resolver: ranking, the per-problem cache, overrides, strict mode and fallbacks.

Ranking, for one problem:
1. Candidates are every implementation of the operator, less the denied ones (``INFINIOPS_DENY``,
   ``use(deny=...)``).
2. Inside a ``use(provider=...)`` scope that covers the operator, only the providers named are
   candidates, in the order given: forcing a provider never falls back to another one.
3. Otherwise the providers named by ``INFINIOPS_PRIORITY`` for the operator come first, in that order,
   then the rest by priority (highest first).
4. The first candidate whose capability accepts the problem wins.

Names are checked: ``use(op=...)`` raises on an unknown operator. A name that the configuration gives and
that matches no loaded provider is a *configuration problem*: a provider in ``INFINIOPS_PROVIDERS`` or
``INFINIOPS_PRIORITY`` that failed to load or that nobody provides, a provider in ``INFINIOPS_DENY`` that
nobody provides (denying one that failed to load is deliberate), an unknown operator in
``INFINIOPS_PRIORITY`` / ``INFINIOPS_DENY``, and likewise a provider forced by ``use(provider=...)`` that is
not loaded or one denied by ``use(deny=...)`` that does not exist. Each logs a warning once (those of the
environment when the resolver is built) naming the provider and its load error; when a scope forces only
providers that are not loaded, the `GateError` says ``provider 'zzz' is not loaded (known: ...)``.

A *fallback* is a win by a candidate ranked below a preferred one (a provider named in
``INFINIOPS_PRIORITY``, or forced by ``use(provider=...)``) that rejected the problem or is not loaded,
or a win by the last-resort ``reference`` provider, unless it is preferred itself, over a candidate of
another provider that rejected the problem, or while a provider named by ``INFINIOPS_PROVIDERS`` is not
loaded (nothing is a fallback where the user denied every other candidate). Fallbacks are
recorded (`Resolver.fallbacks`) and logged (except those due only to providers that are not loaded, whose
warning was given once already).

Strict mode (``INFINIOPS_STRICT``, a boolean) raises `GateError` instead of every fallback, and on every
resolution of an operator that a configuration problem concerns (the allow-list and unknown operators
concern every operator), naming the provider and why it is not loaded.

The decision is cached per (operator, problem key, overrides), so a resolved call costs a dict lookup.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from infiniops_py._env import env_flag, split_names
from infiniops_py.errors import CandidateReport, GateError, likely_fix
from infiniops_py.operators import OPERATORS
from infiniops_py.problem import OpSpec, Problem
from infiniops_py.registry import Implementation, Provider

__all__ = ["Explanation", "Fallback", "Override", "Resolver", "Settings", "use"]

log = logging.getLogger("infiniops")
REFERENCE = "reference"
META = "meta"  # the built-in provider of meta problems: shapes only, outside every ranking


def _per_op(text: str) -> dict[str | None, tuple[str, ...]]:
    """Parse ``op=a,b;op2=c`` (or a bare ``a,b`` for every operator)."""
    out: dict[str | None, tuple[str, ...]] = {}
    for part in text.replace("\n", ";").split(";"):
        if not part.strip():
            continue
        op, sep, names = part.partition("=")
        out[op.strip() if sep else None] = split_names(names if sep else op)
    return out


@dataclass(frozen=True)
class Settings:
    """Resolver settings from the environment (read when the runtime is built or reloaded)."""

    priority: Mapping[str | None, tuple[str, ...]] = field(default_factory=dict)
    deny: Mapping[str | None, tuple[str, ...]] = field(default_factory=dict)
    strict: bool = False
    trace: bool = False
    allow: tuple[str, ...] = ()  # INFINIOPS_PROVIDERS: the entry points allowed to load (empty: all)

    @classmethod
    def from_env(cls) -> Settings:
        """``INFINIOPS_PRIORITY``, ``INFINIOPS_DENY`` (both ``op=a,b;...`` or ``a,b``), ``INFINIOPS_PROVIDERS``
        (``a,b``), and the booleans ``INFINIOPS_STRICT`` and ``INFINIOPS_TRACE_CALLS`` (``1``/``0``,
        ``true``/``false``, ``yes``/``no``, ``on``/``off``; unset or empty is off); ``INFINIOPS_CHECK_INDICES``
        is validated here too (the contracts read it).

        Raises:
            ValueError: a boolean variable set to anything else, naming the variable.
        """
        env = os.environ
        env_flag("INFINIOPS_CHECK_INDICES")  # read per call by the contracts; a bad value is refused here, first
        return cls(
            priority=_per_op(env.get("INFINIOPS_PRIORITY", "")),
            deny=_per_op(env.get("INFINIOPS_DENY", "")),
            strict=env_flag("INFINIOPS_STRICT"),
            trace=env_flag("INFINIOPS_TRACE_CALLS"),
            allow=split_names(env.get("INFINIOPS_PROVIDERS", "")),
        )

    def for_op(self, table: Mapping[str | None, tuple[str, ...]], op: str) -> tuple[str, ...]:
        return table.get(op, table.get(None, ()))


@dataclass(frozen=True)
class Override:
    """One ``use(...)`` scope: force `providers` (in order) and/or deny some, for `ops` (None: all)."""

    providers: tuple[str, ...] = ()
    ops: frozenset[str] | None = None
    deny: tuple[str, ...] = ()

    def covers(self, op: str) -> bool:
        return self.ops is None or op in self.ops


_OVERRIDES: contextvars.ContextVar[tuple[Override, ...]] = contextvars.ContextVar("infiniops_use", default=())


def _names(argument: str, value: str | Sequence[str] | None) -> tuple[str, ...]:
    """One name or a sequence of names as a tuple; TypeError/ValueError name `argument` otherwise."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable):
        raise TypeError(f"use({argument}={value!r}): expected a name (str) or a sequence of names, "
                        f"got {type(value).__name__}")
    names = tuple(items)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"use({argument}={value!r}): expected names as str, got {type(name).__name__} "
                            f"{name!r}")
        if not name.strip():
            raise ValueError(f"use({argument}={value!r}): an empty name")
    return names


def use(
    provider: str | Sequence[str] | None = None,
    *,
    op: str | Sequence[str] | None = None,
    deny: str | Sequence[str] | None = None,
) -> contextlib.AbstractContextManager[None]:
    """Scope in which `op` (one name, several, or all when None) is served only by `provider`.

    ``use(provider="triton", op="flash_attn_varlen")`` forces Triton for that operator (a problem Triton
    cannot serve raises `GateError`, it never falls back); ``use(provider=("triton", "torch"))`` allows
    those two, in that order; ``use(deny="cupy")`` excludes a provider. Scopes nest (the inner one wins)
    and follow `contextvars` (threads and asyncio tasks each see their own).

    Provider names are checked when a call resolves, not here (a provider may be registered inside the
    scope): forcing only providers that are not loaded raises `GateError` saying ``provider 'zzz' is not
    loaded (known: ...)``; a forced provider that is not loaded, or a denied one that does not exist, logs a
    warning once.

    Raises:
        TypeError: `provider`, `op` or `deny` is neither a str nor a sequence of str (``use(provider=5)``).
        ValueError: an unknown operator in `op` (the message lists the known ones), or an empty name.
    """
    names = _names("provider", provider)
    denied = _names("deny", deny)
    ops = None
    if op is not None:
        ops = frozenset(_names("op", op))
        unknown = sorted(ops - set(OPERATORS))
        if unknown:
            raise ValueError(f"use(op={op!r}): unknown operator(s) {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(OPERATORS)})")
        if not ops:
            raise ValueError(f"use(op={op!r}): names no operator (leave op out to cover every operator)")
    return _scope(Override(names, ops, denied))


@contextlib.contextmanager
def _scope(override: Override) -> Iterator[None]:
    token = _OVERRIDES.set((*_OVERRIDES.get(), override))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def current_overrides() -> tuple[Override, ...]:
    return _OVERRIDES.get()


@dataclass(frozen=True)
class Fallback:
    """A resolution that did not get the preferred implementation.

    Attributes:
        problem: the problem resolved.
        chosen: the name of the implementation that serves it.
        passed_over: the reports of the candidates preferred to it that rejected the problem, and of the
            preferred (or allowed) providers that are not loaded: implementation ``-``, the reason in the note.
    """

    problem: Problem
    chosen: str
    passed_over: tuple[CandidateReport, ...]

    def __str__(self) -> str:
        why = "; ".join(f"{c.provider}: " + ", ".join([*map(str, c.rejections), *filter(None, (c.note,))])
                        for c in self.passed_over)
        return f"{self.problem.op} {self.problem.describe()} fell back to {self.chosen} ({why})"


@dataclass(frozen=True)
class Explanation:
    """The full ranking for one problem, as `explain` returns it (nothing runs).

    Attributes:
        note: what the overrides excluded, and forced providers that are not loaded.
        problems: the configuration problems that concern the operator (names of the environment or of the
            ``use(...)`` scopes that match no loaded provider, or no operator); strict mode refuses to
            resolve while there is one.
    """

    problem: Problem
    candidates: tuple[CandidateReport, ...]
    chosen: Implementation | None
    fallback: Fallback | None
    note: str = ""
    problems: tuple[str, ...] = ()

    def render(self) -> str:
        """The ranking as ``infiniops explain`` prints it: the problem, the notes, each candidate (chosen,
        accepts or rejects, with its reasons), then the fallback, or, when nothing serves the problem, the
        most likely fix (`errors.likely_fix`)."""
        lines = [f"{self.problem.op} {self.problem.describe()}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        lines.extend(f"  configuration: {m}" for m in self.problems)
        for rank, c in enumerate(self.candidates, 1):
            mark = "chosen" if self.chosen is not None and c.implementation == self.chosen.name else (
                "accepts" if c.accepted else "rejects")
            lines.append(f"  {rank}. {c.provider} ({c.implementation}, priority {c.priority}): {mark}")
            if c.note:
                lines.append(f"       - {c.note}")
            lines.extend(f"       - {r}" for r in c.rejections)
        if self.chosen is None:
            lines.append("  no provider can serve this problem")
            fix = likely_fix(self.candidates)
            if fix is not None:
                lines.append(f"  most likely fix: {fix[0]} (to use {fix[1]})")
        elif self.fallback is not None:
            lines.append(f"  fallback: {self.fallback}")
        return "\n".join(lines)


class _Ranking(NamedTuple):
    """The candidates for one operator under the overrides, and what the ranking knows about them."""

    candidates: list[Implementation]
    preferred: tuple[str, ...]  # forced by use(provider=...), else INFINIOPS_PRIORITY for the operator
    note: str
    problems: tuple[str, ...]  # configuration problems that concern the operator
    unloaded: tuple[CandidateReport, ...]  # the preferred providers that are not loaded, in preference order


class Resolver:
    """Picks implementations for problems from a fixed set of providers and settings."""

    def __init__(self, providers: Iterable[Provider], settings: Settings, specs: Mapping[str, OpSpec]) -> None:
        self.providers = {p.name: p for p in providers}
        self.settings = settings
        self.specs = specs
        self.by_op: dict[str, list[Implementation]] = {}
        for p in self.providers.values():
            for impl in p.implementations:
                self.by_op.setdefault(impl.op, []).append(impl)
        for impls in self.by_op.values():
            impls.sort(key=lambda i: (-i.priority, i.provider, i.name))
        self.cache: dict[tuple[Any, ...], Implementation] = {}
        self.fallbacks: list[Fallback] = []
        self._warned: set[str] = set()
        self._unloaded_allowed = tuple(self._unloaded(n) for n in settings.allow
                                       if n != REFERENCE and self._not_loaded(n) is not None)
        every, self._problems_of = self._settings_problems()
        for message in every:
            self._warn_once(message)

    # -- names the configuration gives ----------------------------------------------------------------
    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("infiniops: %s", message)

    def _loaded(self) -> str:
        return ", ".join(sorted(p.name for p in self.providers.values() if p.loaded))

    def _not_loaded(self, name: str) -> str | None:
        """Why provider `name` cannot serve anything, or None when it is loaded."""
        p = self.providers.get(name)
        if p is None:
            return f"provider {name!r} is not loaded (known: {self._loaded()})"
        if not p.loaded:
            return f"provider {name!r} is not loaded (it failed to load: {p.error})"
        return None

    def _unloaded(self, name: str) -> CandidateReport:
        """A report for provider `name`, which is not loaded: no implementation, the reason in the note."""
        return CandidateReport(name, "-", 0, (), self._not_loaded(name) or "")

    def _settings_problems(self) -> tuple[list[str], dict[str, tuple[str, ...]]]:
        """The configuration problems of the environment: all of them, and those concerning each operator.

        Providers in ``INFINIOPS_PROVIDERS`` that are not loaded, and unknown operators in
        ``INFINIOPS_PRIORITY`` / ``INFINIOPS_DENY``, concern every operator; a provider in either table
        concerns the operators whose entry names it (a bare list: those without an entry of their own).
        """
        everywhere = [f"INFINIOPS_PROVIDERS: {c.note}" for c in self._unloaded_allowed]
        tables = (("INFINIOPS_PRIORITY", self.settings.priority), ("INFINIOPS_DENY", self.settings.deny))
        keyed: dict[tuple[str, str | None], list[str]] = {}
        for var, table in tables:
            for op, names in table.items():
                if op is not None and op not in self.specs:
                    everywhere.append(f"{var}: unknown operator {op!r}, ignored (known: {', '.join(self.specs)})")
                    continue
                found = keyed.setdefault((var, op), [])
                for name in names:
                    # denying a provider that failed to load is deliberate; naming one nobody knows is a typo
                    why = self._not_loaded(name) if var == "INFINIOPS_PRIORITY" or name not in self.providers else None
                    if why is not None:
                        found.append(f"{var}{f' for {op}' if op else ''}: {why}")
        per_op = {}
        for op in self.specs:
            mine = list(everywhere)
            for var, table in tables:
                mine += keyed.get((var, op if op in table else None), [])
            per_op[op] = tuple(mine)
        return [*everywhere, *(m for found in keyed.values() for m in found)], per_op

    # -- ranking ------------------------------------------------------------------------------------
    def _ranked(self, op: str, overrides: tuple[Override, ...]) -> _Ranking:
        """The candidates in order, the preferred providers, and what was excluded or is missing."""
        impls = [i for i in self.by_op.get(op, ()) if i.provider != META]
        denied = set(self.settings.for_op(self.settings.deny, op))
        forced: tuple[str, ...] = ()
        for ov in overrides:
            if ov.covers(op):
                denied.update(ov.deny)
                if ov.providers:
                    forced = ov.providers
        impls = [i for i in impls if i.provider not in denied]
        note = f"denied: {', '.join(sorted(denied))}" if denied else ""
        scoped = []  # the configuration problems of the use(...) scopes
        for ov in overrides:  # use(deny=...) of a provider that is not loaded: a typo, most likely
            for name in ov.deny if ov.covers(op) else ():
                if name not in self.providers:
                    scoped.append(f"use(deny={name!r}): {self._not_loaded(name)}")
        if forced:
            order = {name: n for n, name in enumerate(forced)}
            kept = [i for i in impls if i.provider in order]
            kept.sort(key=lambda i: order[i.provider])
            left_out = sorted({i.provider for i in impls} - set(forced))
            if left_out:
                note = "; ".join(filter(None, (note, f"use(provider={forced}) excludes {', '.join(left_out)}")))
            missing = [why for why in map(self._not_loaded, forced) if why is not None]
            scoped += [f"use(provider={forced}): {why}" for why in missing]
            serving = {i.provider for i in self.by_op.get(op, ())}
            missing += [f"provider {name!r} implements no {op}" for name in forced
                        if name not in serving and self._not_loaded(name) is None]
            note = "; ".join(filter(None, (note, *missing)))
            impls, preferred = kept, forced
        else:
            preferred = self.settings.for_op(self.settings.priority, op)
            order = {name: n for n, name in enumerate(preferred)}
            impls.sort(key=lambda i: (order.get(i.provider, len(order)),))  # stable: priority order kept
        for message in scoped:  # the environment's problems were given when the resolver was built
            self._warn_once(message)
        problems = tuple(dict.fromkeys((*self._problems_of.get(op, ()), *scoped)))
        unloaded = tuple(self._unloaded(name) for name in dict.fromkeys(preferred) if self._not_loaded(name))
        return _Ranking(impls, preferred, note, problems, unloaded)

    def _fallback(self, problem: Problem, ranking: _Ranking, reports: list[CandidateReport],
                  chosen: Implementation) -> Fallback | None:
        """The fallback that choosing `chosen` is, or None (see the module doc)."""
        above = reports[: ranking.candidates.index(chosen)]
        preferred = ranking.preferred
        rank = preferred.index(chosen.provider) if chosen.provider in preferred else len(preferred)
        # passing over a sibling implementation of the chosen provider is no fallback
        passed = [r for r in above if r.provider in preferred and r.provider != chosen.provider]
        passed += [r for r in ranking.unloaded if preferred.index(r.provider) < rank]
        if passed:
            return Fallback(problem, chosen.name, tuple(passed))
        if chosen.provider != REFERENCE or REFERENCE in preferred:
            return None
        others = [r for r in above if r.provider != REFERENCE]
        if others or self._unloaded_allowed:
            return Fallback(problem, chosen.name, (*others, *self._unloaded_allowed))
        return None

    def explain(self, problem: Problem, overrides: tuple[Override, ...] = ()) -> Explanation:
        """Rank every candidate for `problem`, pick one, and say why; runs nothing, raises nothing.

        A candidate whose constraint raises or returns something other than a `Rejection` or None is
        rejected for it (`capability.safe_reject`), so a faulty plugin never breaks the ranking.

        A meta problem has one candidate, the built-in ``meta`` provider (its outputs hold no values, so there
        is no provider to choose): no scope or setting applies to it, and it is never a fallback. The
        ``meta`` provider is no candidate of any other problem.
        """
        if problem.device_type == META:
            metas = [i for i in self.by_op.get(problem.op, ()) if i.provider == META]
            reports = [CandidateReport(i.provider, i.name, i.priority, i.capability.reasons(problem)) for i in metas]
            served = next((i for i, r in zip(metas, reports) if not r.rejections), None)
            return Explanation(problem, tuple(reports), served, None)
        ranking = self._ranked(problem.op, overrides)
        reports: list[CandidateReport] = []
        chosen: Implementation | None = None
        for impl in ranking.candidates:
            rejections = impl.capability.reasons(problem)
            reports.append(CandidateReport(impl.provider, impl.name, impl.priority, rejections))
            if not rejections and chosen is None:
                chosen = impl
        fallback = None if chosen is None else self._fallback(problem, ranking, reports, chosen)
        return Explanation(problem, tuple(reports), chosen, fallback, ranking.note, ranking.problems)

    def resolve(self, problem: Problem, overrides: tuple[Override, ...] = ()) -> Implementation:
        """The implementation for `problem`.

        A fallback is recorded in `fallbacks` and logged (one due only to providers that are not loaded is
        not logged again: their warning was given once).

        Raises:
            GateError: no candidate accepts the problem; or strict mode forbids the fallback it needs, or
                refuses because a configuration problem concerns the operator (the headline names the
                provider and why it is not loaded).
        """
        ex = self.explain(problem, overrides)
        strict = self.settings.strict
        headline = ("INFINIOPS_STRICT=1 refuses to resolve while the configuration names what is not loaded: "
                    + "; ".join(ex.problems)) if strict and ex.problems else ""
        if ex.chosen is None:
            reports = list(ex.candidates)
            if ex.note:
                reports.append(CandidateReport("(excluded)", "-", 0, (), ex.note))
            unsaid = [m for m in ex.problems if m.partition(": ")[2] not in ex.note]
            if unsaid:
                reports.append(CandidateReport("(configuration)", "-", 0, (), "; ".join(unsaid)))
            raise GateError([(problem, reports)], headline=headline)
        if headline:
            raise GateError([(problem, list(ex.candidates))], headline=headline)
        if ex.fallback is not None:
            if strict:
                raise GateError([(problem, list(ex.candidates))],
                                headline=f"INFINIOPS_STRICT=1 forbids this fallback: {ex.fallback}")
            self.fallbacks.append(ex.fallback)
            if any(r.rejections for r in ex.fallback.passed_over):
                log.warning("infiniops fallback: %s", ex.fallback)
        return ex.chosen

    def resolve_key(self, spec: OpSpec, key: tuple[Any, ...], overrides: tuple[Override, ...]) -> Implementation:
        """Slow path of a call: build the problem behind `key`, resolve it, and cache the decision."""
        impl = self.resolve(spec.problem_from_key(key), overrides)
        self.cache[(spec.name, key, overrides)] = impl
        return impl

    def resolve_closure(
        self, requests: Iterable[Problem], overrides: tuple[Override, ...] = ()
    ) -> dict[Problem, Implementation]:
        """Resolve several problems at once; one `GateError` lists every gap.

        Raises:
            GateError: with one entry in ``gaps`` for each problem that cannot be served; its headline
                keeps those of the errors behind the gaps (strict mode's reasons), each once.
        """
        chosen: dict[Problem, Implementation] = {}
        gaps: list[tuple[Problem, list[CandidateReport]]] = []
        why: dict[str, None] = {}  # the headlines of the errors (strict mode's reasons), each once
        for problem in requests:
            try:
                chosen[problem] = self.resolve(problem, overrides)
            except GateError as err:
                gaps.extend(err.gaps)
                if err.headline:
                    why[err.headline] = None
        if gaps:
            headline = f"{len(gaps)} operator problem(s) of this configuration have no provider"
            raise GateError(gaps, headline="\n".join((headline, *why)))
        return chosen
