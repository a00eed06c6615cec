"""The capability resolver: ranking, the per-problem cache, overrides, strict mode and fallbacks.

Ranking, for one problem:
1. Candidates are every implementation of the operator, less the denied ones (``INFINIOPS_DENY``,
   ``use(deny=...)``).
2. Inside a ``use(provider=...)`` scope that covers the operator, only the providers named are
   candidates, in the order given: forcing a provider never falls back to another one.
3. Otherwise the providers named by ``INFINIOPS_PRIORITY`` for the operator come first, in that order,
   then the rest by priority (highest first).
4. Measured times reorder the candidates that no ``use(provider=...)`` scope or ``INFINIOPS_PRIORITY`` entry
   placed: when this device has a measurement of the problem's size bucket (`infiniops_py.tuning`), the
   accepting implementations it timed come first, fastest first, a tie inside the noise margin
   (`infiniops_py.tuning.ranking.NOISE_MARGIN`) going to the higher priority; the others keep their priority
   order after them. Without a measurement (no bucket, nothing timed, ``INFINIOPS_TUNING=off``) priority alone
   ranks. The last-resort ``reference`` provider is never promoted by time, nor is an implementation whose
   name one of another provider carries too (implementation names are unique within a provider only).
5. The first candidate whose capability accepts the problem wins.

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

The decision is cached per (operator, problem key, overrides), so a resolved call costs a dict lookup; the
key holds the size bucket's classes (`infiniops_py.problem.size_class`), so each bucket has its own decision,
and adding measurements (`infiniops_py.tuning.tune_calls`) clears the cache.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from infiniops_py.errors import CandidateReport, GateError
from infiniops_py.explanation import Explanation, Fallback
from infiniops_py.overrides import _OVERRIDES, Override, Settings, current_overrides, use
from infiniops_py.problem import OpSpec, Problem
from infiniops_py.registry import Implementation, Provider
from infiniops_py.tuning.ranking import measured_order, why_chosen
from infiniops_py.tuning.store import Measurement, TuningTable

__all__ = ["_OVERRIDES", "Explanation", "Fallback", "Override", "Resolver", "Settings", "current_overrides", "use"]

log = logging.getLogger("infiniops")
REFERENCE = "reference"
META = "meta"  # the built-in provider of meta problems: shapes only, outside every ranking


def _key(impl: Implementation) -> tuple[str, str]:
    """What tells implementations apart: names are unique within a provider only."""
    return impl.provider, impl.name


def _forced(op: str, overrides: tuple[Override, ...]) -> bool:
    """Whether a ``use(provider=...)`` scope of `overrides` forces the providers of `op`."""
    return any(ov.providers for ov in overrides if ov.covers(op))


class _Ranking(NamedTuple):
    """The candidates for one operator under the overrides, and what the ranking knows about them."""

    candidates: list[Implementation]
    preferred: tuple[str, ...]  # forced by use(provider=...), else INFINIOPS_PRIORITY for the operator
    note: str
    problems: tuple[str, ...]  # configuration problems that concern the operator
    unloaded: tuple[CandidateReport, ...]  # the preferred providers that are not loaded, in preference order


class Resolver:
    """Picks implementations for problems from a fixed set of providers and settings."""

    def __init__(self, providers: Iterable[Provider], settings: Settings, specs: Mapping[str, OpSpec],
                 tuning: TuningTable | None = None) -> None:
        """`tuning`: the measured times to rank by; None builds a `TuningTable` for the loaded providers from
        ``settings.tuning`` (``INFINIOPS_TUNING``), which reads nothing until a problem with a bucket resolves."""
        self.providers = {p.name: p for p in providers}
        self.settings = settings
        self.specs = specs
        self.tuning = tuning if tuning is not None else TuningTable(
            {p.name: p.version for p in self.providers.values() if p.loaded}, settings.tuning)
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
        rejected = {_key(impl): impl.capability.reasons(problem) for impl in ranking.candidates}
        ranking, measurement, why = self._measured(problem, ranking, rejected, overrides)
        reports = [CandidateReport(i.provider, i.name, i.priority, rejected[_key(i)]) for i in ranking.candidates]
        chosen = next((i for i in ranking.candidates if not rejected[_key(i)]), None)
        fallback = None if chosen is None else self._fallback(problem, ranking, reports, chosen)
        if chosen is not None and not why:
            why = self._why(problem, ranking, chosen, measurement, _forced(problem.op, overrides))
        return Explanation(problem, tuple(reports), chosen, fallback, ranking.note, ranking.problems,
                           measurement, why)

    def _measured(self, problem: Problem, ranking: _Ranking, rejected: Mapping[tuple[str, str], Any],
                  overrides: tuple[Override, ...]) -> tuple[_Ranking, Measurement | None, str]:
        """`ranking` reordered by the measurement of `problem`'s bucket (see the module doc, step 4), the
        measurement (None when there is none; a scope that forces providers keeps their order), and why the
        winner won when the measurement decided it (else empty). A time under a name that several candidates
        carry (of different providers) cannot say whose it is: it ranks none of them."""
        measurement = self.tuning.lookup(problem)
        if measurement is None or _forced(problem.op, overrides):
            return ranking, measurement, ""
        head = [i for i in ranking.candidates if i.provider in ranking.preferred]
        free = [i for i in ranking.candidates if i.provider not in ranking.preferred]
        names = Counter(i.name for i in ranking.candidates)
        accepted = {i.name for i in free if not rejected[_key(i)] and names[i.name] == 1}
        order = measured_order(free, accepted, measurement)
        if not order:
            return ranking, measurement, ""
        timed = {i.name for i in order}
        candidates = [*head, *order, *(i for i in free if i.name not in timed)]
        why = "" if any(not rejected[_key(i)] for i in head) else why_chosen(order[0], order, measurement)
        return ranking._replace(candidates=candidates), measurement, why

    def _why(self, problem: Problem, ranking: _Ranking, chosen: Implementation, measurement: Measurement | None,
             forced: bool) -> str:
        """Why `chosen` won where the measurement did not decide: an override, or priority (and why no time)."""
        if chosen.provider in ranking.preferred:
            how = "use(provider=...)" if forced else "INFINIOPS_PRIORITY"
            return f"{chosen.name}: {how} prefers provider {chosen.provider!r}"
        spec = self.specs.get(problem.op)
        if spec is None or not spec.buckets:
            return f"{chosen.name}: highest priority that accepts the problem"
        if not problem.bucket:
            return (f"{chosen.name}: highest priority that accepts the problem (no size bucket: give "
                    f"{', '.join(spec.buckets)} to rank by measured time)")
        if not self.tuning.enabled:
            return f"{chosen.name}: highest priority that accepts the problem (INFINIOPS_TUNING=off)"
        if measurement is None:
            return (f"{chosen.name}: highest priority that accepts the problem (nothing measured for this bucket "
                    "on this device: infiniops tune measures it)")
        return f"{chosen.name}: highest priority that accepts the problem (the measured ones reject it or failed)"

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
