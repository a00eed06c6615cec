"""What one call may touch and what it must return, for the conformance suite.

A conformant call writes only its outputs (the ``out=`` tensor and the arguments its contract updates in
place), leaves every other byte of its arguments' memory as it was, and returns the contract's objects; the
provider's implementation returns what its calling convention says (the ``out`` it was handed, or None).

- `guarded` moves every argument's storage into a buffer with `GUARD_BYTES` of poison on each side, so that
  a write past either end of an argument lands where `Snapshot` sees it;
- `Snapshot` copies those buffers before the call and names, after it, any changed byte that no output
  element covers: an input the contract leaves untouched, or memory outside every output;
- `recorded_calls` records each implementation call of a block (`infiniops_py.dispatch.dispatch`), with what the
  implementation returned, and `convention_of` / `check_returns` compare those with the reference's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

import torch

from infiniops_py.dispatch import Dispatched, observing
from infiniops_py.memory import overlaps

__all__ = [
    "GUARD_BYTES",
    "NO_RULE",
    "Snapshot",
    "check_result",
    "check_returns",
    "convention_of",
    "guarded",
    "recorded_calls",
]

GUARD_BYTES: Final = 512  # a multiple of every element size and of the CUDA allocator's 512-byte alignment
_POISON: Final = 0xFF  # NaN in every float dtype, -1 in every integer one
NO_RULE: Final = "no rule"  # `convention_of` when the reference returned neither None nor one of its arguments

Call = tuple[tuple[Any, ...], Any]  # (the implementation's arguments, what it returned)


def guarded(tree: Any) -> Any:
    """`tree` (tuples, lists, dicts) with every tensor moved into a guarded buffer, on its own device.

    Each storage becomes a ``uint8`` buffer of ``GUARD_BYTES + nbytes + GUARD_BYTES`` whose middle holds a
    copy of its bytes and whose ends hold 0xFF; every tensor of that storage becomes the same view (shape,
    strides, offset) of the middle, so aliasing between arguments is kept, and a tensor named twice is one
    tensor named twice. The data pointers keep their alignment modulo 512. A tensor whose storage cannot
    be re-viewed (a subclass without ``set_``) is left where it is.
    """
    buffers: dict[int, torch.Tensor] = {}
    moved: dict[int, torch.Tensor] = {}

    def move(t: torch.Tensor) -> torch.Tensor:
        if id(t) in moved:
            return moved[id(t)]
        storage = t.untyped_storage()
        buffer = buffers.get(storage.data_ptr())
        if buffer is None:
            try:
                flat = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            except RuntimeError:
                return t
            buffer = torch.full((flat.numel() + 2 * GUARD_BYTES,), _POISON, dtype=torch.uint8, device=t.device)
            buffer[GUARD_BYTES:GUARD_BYTES + flat.numel()].copy_(flat)
            buffers[storage.data_ptr()] = buffer
        offset = GUARD_BYTES // t.element_size() + t.storage_offset()
        view = torch.empty(0, dtype=t.dtype, device=t.device)
        view.set_(buffer.untyped_storage(), offset, t.shape, t.stride())
        moved[id(t)] = view
        return view

    return map_tensors(tree, move)


def map_tensors(tree: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`tree` (tensors inside tuples, lists and dicts) with every tensor replaced by ``fn(tensor)``."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_tensors(v, fn) for v in tree)
    if isinstance(tree, dict):
        return {k: map_tensors(v, fn) for k, v in tree.items()}
    return tree


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """Every byte of `t`'s storage as a flat ``uint8`` tensor (a view, not a copy)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _element_bytes(flat: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t`'s elements inside `flat` (its storage's bytes, any dtype): shape ``[*t.shape, size]``."""
    size = t.element_size()
    return flat.as_strided((*t.shape, size), (*(s * size for s in t.stride()), 1), t.storage_offset() * size)


class Snapshot:
    """The bytes of every argument's storage before a call, to find the bytes the call should not have
    changed: those of no output element.

    Args:
        arguments: every tensor argument of the call by name (parameter names, as the failure says them).
    """

    def __init__(self, arguments: Mapping[str, torch.Tensor]) -> None:
        self.arguments = dict(arguments)
        self._before: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # storage -> (bytes now, copy)
        for t in self.arguments.values():
            key = t.untyped_storage().data_ptr()
            if key not in self._before:
                try:
                    flat = _bytes_of(t)
                except RuntimeError:
                    continue
                self._before[key] = (flat, flat.clone())

    def stray_writes(self, outputs: Sequence[str]) -> str | None:
        """After the call: None when every changed byte lies in an element of an argument named in
        `outputs`, else one line naming the input that changed, or where memory outside every output did."""
        for key, (flat, old) in self._before.items():
            changed = flat != old
            if not bool(changed.any()):
                continue
            on_storage = {n: t for n, t in self.arguments.items() if t.untyped_storage().data_ptr() == key}
            allowed = torch.zeros_like(changed)
            for name in outputs:
                if name in on_storage and on_storage[name].numel():
                    _element_bytes(allowed, on_storage[name]).fill_(True)
            stray = changed & ~allowed
            if not bool(stray.any()):
                continue
            for name, t in on_storage.items():
                if name in outputs or not t.numel():
                    continue
                hit = _element_bytes(stray, t).any(-1)
                if bool(hit.any()):
                    return (f"argument {name!r} changed although the contract leaves it untouched: "
                            f"{int(hit.sum())} of {t.numel()} elements written")
            return _outside(stray, on_storage)
        return None


def _outside(stray: torch.Tensor, on_storage: Mapping[str, torch.Tensor]) -> str:
    """Say where bytes that belong to no argument's element changed (`stray` over one storage's bytes)."""
    where = torch.nonzero(stray).flatten()
    first, last, count = int(where[0]), int(where[-1]), int(where.numel())
    covered = torch.zeros_like(stray)
    for t in on_storage.values():
        if t.numel():
            _element_bytes(covered, t).fill_(True)
    spots = torch.nonzero(covered).flatten()
    names = ", ".join(repr(n) for n in on_storage)
    if spots.numel() and last < int(spots[0]):
        side = f"{int(spots[0]) - first} byte(s) before the first element"
    elif spots.numel() and first > int(spots[-1]):
        side = f"{last - int(spots[-1])} byte(s) past the last element"
    else:
        side = "between the elements"
    return f"wrote outside its outputs: {count} byte(s) changed, up to {side} of {names}"


@contextlib.contextmanager
def recorded_calls() -> Iterator[list[Call]]:
    """Record, in the block and on this thread, each implementation call that an operator dispatches:
    ``(arguments, what the implementation returned)``.

    It observes the block's context (`infiniops_py.dispatch.observing`); a call made on another thread, even one
    run in a copy of this context, is not recorded.
    """
    calls: list[Call] = []
    thread = threading.get_ident()

    def record(call: Dispatched) -> None:
        if threading.get_ident() == thread:
            calls.append((call.args, call.returned))

    with observing(record):
        yield calls


def convention_of(call: Call) -> int | str | None:
    """What an implementation call returned, as a rule: the position of the argument it returned itself,
    None for None, `NO_RULE` for anything else (the reference's calls make the rules)."""
    args, returned = call
    if returned is None:
        return None
    for i, a in enumerate(args):
        if returned is a:
            return i
    return NO_RULE


def check_returns(provider: str, op: str, rules: Sequence[int | str | None], calls: Sequence[Call]) -> str | None:
    """None when each of the provider's implementation calls returned what the reference's did in its
    place (`rules`, from `convention_of`): the argument at the same position itself, or None."""
    for rule, (args, returned) in zip(rules, calls):
        if isinstance(rule, str) or (rule is None and returned is None):
            continue
        if rule is None:
            return (f"{provider}'s {op} implementation returned {_describe(returned)}; its calling convention "
                    "returns None")
        if returned is not args[rule]:
            return (f"{provider}'s {op} implementation returned {_describe(returned)}; its calling convention "
                    f"returns the tensor it was handed as argument {rule} (out) itself")
    return None


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"another tensor (shape {list(value.shape)}, {value.dtype})"
    return f"a {type(value).__name__}"


def _elements(result: Any) -> list[Any] | None:
    """A result as its list of elements (a tensor is one), or None for None."""
    if result is None:
        return None
    return list(result) if isinstance(result, (tuple, list)) else [result]


def check_result(expected: Any, expected_args: Mapping[str, Any], result: Any, args: Mapping[str, Any],
                 out: torch.Tensor | None = None) -> str | None:
    """None when the public function returned the contract's objects, judged by the reference run.

    Args:
        expected, expected_args: the reference run's result and its arguments by name.
        result, args: the run under test's result and arguments by name.
        out: the ``out=`` tensor the run under test was handed and the reference run was not; then the
            result must be it.

    Each element of `result` must be the argument (by name) that the reference's element was, and an
    element that was no argument must be a tensor sharing no memory with any argument (a new tensor).
    """
    want, got = _elements(expected), _elements(result)
    if want is None and got is None:
        return None
    if (want is None or got is None or len(want) != len(got)
            or isinstance(expected, torch.Tensor) != isinstance(result, torch.Tensor)):
        return f"returned {_shape_of(result)}; the contract returns {_shape_of(expected)}"
    for i, (w, g) in enumerate(zip(want, got)):
        label = "the result" if isinstance(result, torch.Tensor) else f"result[{i}]"
        if out is not None and i == 0 and isinstance(result, torch.Tensor):
            if g is not out:
                return f"{label} is not the out= tensor it was handed"
            continue
        names = [n for n, a in expected_args.items() if w is not None and a is w]
        if names:
            if not any(g is args.get(n) for n in names):
                return f"{label} is not argument {names[0]!r} itself, which the contract returns"
            continue
        if w is None or g is None:
            if (w is None) != (g is None):
                return f"{label} is {_shape_of(g)}; the contract returns {_shape_of(w)}"
            continue
        if not isinstance(g, torch.Tensor):
            return f"{label} is {_shape_of(g)}; the contract returns a tensor"
        for n, a in args.items():
            if isinstance(a, torch.Tensor) and overlaps(g, a):
                return f"{label} shares memory with argument {n!r}; the contract returns a new tensor"
    return None


def _shape_of(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return "a tensor"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"
