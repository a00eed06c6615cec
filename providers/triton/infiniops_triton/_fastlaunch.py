"""Triton kernels launched without Triton's per-call binding and specialization (issue #25).

``kernel[grid](...)`` in Triton 3.6 (``JITFunction.run``) binds every argument through a generated function,
specializes each one, turns the options into a string for its cache key, checks the kernel's globals, builds
a launch-metadata dict for the launch hooks and goes through two Python wrappers before the C launcher, all
of it on every call. A `Launcher` keeps, per specialization, the `CompiledKernel` Triton compiled and calls
its C launcher itself, with the current raw stream.

What decides the compiled binary (the exact key, `arg_key`):

- each tensor: its dtype and whether ``data_ptr()`` is a multiple of 16 (Triton's pointer alignment);
- each int: 1 (Triton makes it a constant), otherwise whether it is a multiple of 16 and whether it fits
  int32 or int64 (the type Triton gives it); a bool, a float and None stand for their type;
- each constexpr's value, the options (``num_warps``, ``num_stages``, ``launch_pdl``, ...), the debug and
  instrumentation knobs, and the current device.

The key is finer than Triton's own (a parameter marked ``do_not_specialize`` still splits keys: one more
launch through Triton at worst, never a wrong binary); constexprs compare by value, as in Triton's own cache
(``True == 1``). Heuristics (``triton.heuristics``) are evaluated on every call, as Triton does.

How a call is made cheap. Each launcher's ``__call__`` is Python source generated for its kernel (`_Source`),
so that Python itself binds the call to the kernel's parameters (no ``*args`` tuple, no dict of the arguments
but for heuristics, which take one) and the key is one flat tuple built inline, with no function call per
argument in the common cases. It runs in two stages:

1. ``general``, the first calls: the exact key above, its common cases (a tensor, an int in ``(1, 2**31)``)
   inlined; a miss launches through Triton (``kernel[grid](...)``, which compiles as usual) and keeps the
   kernel it returns; a hit calls the C launcher with every parameter, constexprs included (the 3.6 launcher
   skips them).
2. ``planned``, from the first hit on: generated again for which runtime arguments were tensors in that call.
   Its key holds each tensor's dtype and ``data_ptr() % 16`` and every other runtime argument as its value
   and its type, so an int costs no classification (a call of the same shapes, the steady state, builds the
   same tuple); the tensors reach the C launcher as those addresses (an int is what Triton's launcher turns
   a tensor into: no method call and no ``cuPointerGetAttribute`` per tensor). A planned miss (new values, a
   None or an int where a tensor was) goes through ``general``, which finds the kernel by the exact key and
   remembers it under the planned one when that key holds only ints, floats, bools and None (never a tensor
   held by a key); the planned keys are forgotten all at once past `_MAX_PLANNED`.

Chosen over `CompiledKernel.__getitem__` (Triton's own direct launch), which builds a closure and the hooks'
metadata on every call (3.6's hook chains are never None, so ``launch_metadata`` always builds its dict), and
over binding with Triton's generated binder, which needs ``str(options)`` for its cache key on every call.
Not done: a launcher with its arguments fixed per call site (the call sites would carry the keys; one wrong
key there is a wrong binary). Passing addresses skips Triton's check that a pointer is device memory: the
public functions have checked every tensor's device before a provider runs.

Launch hooks (``knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``) run as in Triton: with metadata
when a hook is registered, skipped (None) when the chains are empty. A kernel with ``pre_run_hooks`` always
launches through Triton. Not repeated on the fast path: the check that the kernel's global variables have
not changed since it was compiled (ours read module constants).

The fast path exists only where its calling convention was read in Triton's source: Triton 3.6.x with the
CUDA launcher. Everywhere else, under the interpreter (``TRITON_INTERPRET=1``), with
``INFINIOPS_TRITON_FASTLAUNCH=0``, or after `set_enabled(False)`, a `Launcher` is exactly
``kernel[grid](*args, **kwargs)``; so is a call with an argument the key does not know (any other type) or
an option value that does not hash (Triton keys options by their str).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Hashable
from typing import Any, Final

import torch
import triton
from triton import knobs
from triton.knobs import HookChain
from triton.runtime.autotuner import Heuristics
from triton.runtime.jit import JITFunction

__all__ = ["Launcher", "arg_key", "enabled", "set_enabled", "supported"]

# the Triton versions whose launch path (runtime/jit.py JITFunction.run, compiler/compiler.py CompiledKernel,
# backends/nvidia/driver.py CudaLauncher) this module reproduces
_VERIFIED: Final = ("3.6.",)


def supported(version: str | None = None, environ: dict[str, str] | None = None) -> bool:
    """Whether the fast path may be used with Triton `version` (default: the installed one) under `environ`
    (default: ``os.environ``): a verified version, not the interpreter, not ``INFINIOPS_TRITON_FASTLAUNCH=0``
    (or ``false``, ``no``, ``off``)."""
    version = triton.__version__ if version is None else version
    environ = os.environ if environ is None else environ
    switch = environ.get("INFINIOPS_TRITON_FASTLAUNCH", "").strip().lower()
    return (version.startswith(_VERIFIED) and environ.get("TRITON_INTERPRET") != "1"
            and switch not in ("0", "false", "no", "off"))


_enabled: bool = supported()


def enabled() -> bool:
    """Whether launchers take the fast path (where their kernel allows it)."""
    return _enabled


def set_enabled(on: bool) -> bool:
    """Turn the fast path on or off for every launcher (benchmarks compare both); returns the previous state.
    Turning it on where `supported` is false does nothing."""
    global _enabled
    previous, _enabled = _enabled, bool(on) and supported()
    return previous


_INT32: Final = 1 << 31
_INT64: Final = 1 << 63
_Tensor: Final = torch.Tensor


class _Unkeyed(Exception):
    """An argument of a type the key does not cover: the call goes through Triton."""


def arg_key(arg: Any) -> Hashable:
    """What of a runtime (non-constexpr) argument can change Triton 3.6's compiled kernel (the module docstring).

    Raises:
        _Unkeyed: `arg` is of another type than a tensor, int, bool, float or None.
    """
    kind = type(arg)
    if kind is int:
        if arg == 1:
            return 1
        size = 0 if -_INT32 <= arg < _INT32 else 2 if -_INT64 <= arg < _INT64 else 4
        return size + 2 + (not arg & 15)  # 2..7: never 1
    if kind is float or kind is bool or arg is None:
        return kind
    if isinstance(arg, _Tensor):  # a subclass (nn.Parameter); aligned: the dtype alone (no tuple to build)
        return arg.dtype if not arg.data_ptr() & 15 else (arg.dtype,)
    raise _Unkeyed(kind)


# Per runtime argument, `arg_key` inlined in the generated functions (``{a}``: the parameter's name), its common
# cases without a call: a tensor of the exact class and a plain int between 2 and 2**31 - 1.
_TENSOR_KEY: Final = "(({a}.dtype if not {a}.data_ptr() & 15 else ({a}.dtype,)) if {a}.__class__ is __T else "
_INT_KEY: Final = "((2 + (not {a} & 15)) if {a}.__class__ is int and 1 < {a} < 2147483648 else __k({a})))"


def _key_exprs(fn: JITFunction) -> list[str]:
    """One key expression per parameter of `fn`, in order: a constexpr by value, a runtime argument as above."""
    return [p.name if p.is_constexpr else (_TENSOR_KEY + _INT_KEY).format(a=p.name) for p in fn.params]


def _namespace(fn: JITFunction) -> dict[str, Any]:
    namespace: dict[str, Any] = {f"__d_{n}": p.default for n, p in fn.signature.parameters.items()
                                 if p.default is not inspect.Parameter.empty}
    namespace["__k"], namespace["__T"] = arg_key, _Tensor
    return namespace


_TAKEN: Final = frozenset({"int", "tuple", "len", "callable", "_Unkeyed"})  # read by the generated functions


def _check_names(fn: JITFunction) -> list[str]:
    """The kernel's parameter names, none of which may shadow a name the generated functions read (theirs
    start with two underscores).

    Raises:
        _Unkeyed: one does.
    """
    names = list(fn.signature.parameters)
    if any(n.startswith("__") or n in _TAKEN for n in names):
        raise _Unkeyed(names)
    return names


def _make_binder(fn: JITFunction) -> Callable[..., tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """``bind(*args, **kwargs) -> (params, key)``: every parameter in order (defaults applied) and the key of
    the parameters and the remaining options, as Python binds a call (a TypeError names a missing argument).
    The fast path computes the same key inline (`_Source.general`)."""
    names = _check_names(fn)
    decl = [n if p.default is inspect.Parameter.empty else f"{n}=__d_{n}" for n, p in fn.signature.parameters.items()]
    src = (f"def bind({', '.join([*decl, '**__options'])}):\n"
           f"    return ({', '.join(names)},), ({', '.join(_key_exprs(fn))}, *__options.items())\n")
    namespace = _namespace(fn)
    exec(src, namespace)
    return namespace["bind"]


class _Source:
    """The Python source of a kernel's generated ``__call__`` functions (`general` and `planned`)."""

    def __init__(self, fn: JITFunction, heuristics: list[Heuristics]) -> None:
        self.fn, self.heuristics = fn, heuristics
        self.names = _check_names(fn)
        heuristic_names = [n for layer in heuristics for n in layer.values]
        self.decl: list[str] = []
        self.required_late: list[str] = []
        late = False  # a parameter a heuristic sets needs a default; every later one then gets a sentinel default
        for n, p in fn.signature.parameters.items():
            if p.default is not inspect.Parameter.empty:
                self.decl.append(f"{n}=__d_{n}")
                late = True
            elif n in heuristic_names:
                if "*" not in self.decl:  # Heuristics.run passes its values by keyword: in Triton a positional
                    self.decl.append("*")  # argument that reaches this parameter is a "multiple values" TypeError
                self.decl.append(f"{n}=__H")
                late = True
            elif late:
                self.decl.append(f"{n}=__H")
                self.required_late.append(n)
            else:
                self.decl.append(n)
        self.params = ", ".join(self.names)
        keyword = self.decl.index("*") if "*" in self.decl else len(self.names)  # the keyword-only ones from here
        self.passed = ", ".join([*self.names[:keyword], *(f"{n}={n}" for n in self.names[keyword:])])
        self.named = "{" + ", ".join(f"{n!r}: {n}" for n in self.names) + "}"

    def head(self, name: str, extra: str = "") -> list[str]:
        """The signature, the missing-argument check, the way out when the fast path is off, the heuristics."""
        if "*" in self.decl:  # the parameters from the first a heuristic sets on are keyword-only already
            extra = extra.removeprefix("*, ")
        lines = [f"def {name}(__self, __grid, /, {', '.join(self.decl)}, {extra}**__options):"]
        if self.required_late:  # as Python would raise for a missing argument
            lines += [f"    if {' or '.join(f'{n} is __H' for n in self.required_late)}:",
                      f"        __missing({self.required_late!r}, {', '.join(self.required_late)})"]
        lines += ["    if not __module._enabled or __base.pre_run_hooks:",
                  f"        return __self._plain_call(__grid, {self.named}, __options)"]
        for depth, layer in enumerate(self.heuristics):  # as Heuristics.run, from the outermost in; the named
            lines.append(f"    __named = {self.named[:-1]}, **__options}}")  # dict once per layer, as in Triton
            for i, n in enumerate(layer.values):
                lines.append(f"    {n} = __named[{n!r}] = __h{depth}_{i}(__named)")
        return lines

    def tail(self, launched: str) -> list[str]:
        """From the kept `__bound` on: the grid, the stream, the hooks and the C launch of `launched`."""
        return [
            "    if __grid.__class__ is not tuple:",
            f"        __grid = __grid({self.named}) if callable(__grid) else tuple(__grid)",
            "    __size = len(__grid)",
            "    __stream = __C._cuda_getCurrentRawStream(__key[0])",
            "    __enter, __leave = __runtime.launch_enter_hook, __runtime.launch_exit_hook",
            "    if (__enter.__class__ is not __Chain or __enter.calls or __leave.__class__ is not __Chain",
            "            or __leave.calls) and (__hooked(__enter) or __hooked(__leave)):",
            f"        __metadata = __bound.compiled.launch_metadata(__grid, __stream, {self.params})",
            "    else:",
            "        __metadata = __enter = __leave = None",
            "    __bound.launch(__grid[0], __grid[1] if __size > 1 else 1, __grid[2] if __size > 2 else 1, __stream,",
            f"                   *__bound.prefix, __metadata, __enter, __leave, {launched})"]

    def general(self) -> str:
        """``__call__`` keyed exactly (`arg_key` inlined): the first calls, and the planned one's misses, which
        pass `__l1`, the planned key to remember the kernel under."""
        lines = [*self.head("general", "*, __l1=None, "),
                 "    try:",
                 f"        __key = (__C._cuda_getDevice(), __runtime.debug, __compilation.instrumentation_mode, "
                 f"{', '.join(_key_exprs(self.fn))}, *__options.items())",
                 "        __bound = __self._cache.get(__key)",
                 "    except (_Unkeyed, TypeError):  # TypeError: an unhashable option (Triton keys options by str)",
                 f"        return __self._plain_call(__grid, {self.named}, __options)",
                 "    if __bound is None:",
                 f"        return __self._miss(__key, __grid, ({self.params},), __options)",
                 "    if __l1 is not None:",
                 "        __self._remember(__l1, __bound)",
                 "    elif not __self._planned:",
                 f"        __self._plan(({self.params},))",
                 *self.tail(self.params)]
        return "\n".join(lines) + "\n"

    def planned(self, tensors: frozenset[str]) -> tuple[str, tuple[int, ...]]:
        """``__call__`` for calls whose runtime arguments are tensors exactly in `tensors` (by name): keyed by
        each tensor's dtype and address modulo 16, every other runtime argument's value and type, and the
        constexprs and options; the tensors reach the C launcher as their addresses. Also the positions of the
        types in that key (`Launcher._remember` checks them)."""
        parts = ["__C._cuda_getDevice()", "__runtime.debug", "__compilation.instrumentation_mode"]
        launched: list[str] = []
        types: list[int] = []
        for p in self.fn.params:
            n = p.name
            if p.is_constexpr:
                parts.append(n)
                launched.append(n)
            elif n in tensors:
                parts += [f"{n}.dtype", f"(__p_{n} := {n}.data_ptr()) & 15"]
                launched.append(f"__p_{n}")
            else:
                parts += [n, f"{n}.__class__"]
                types.append(len(parts) - 1)
                launched.append(n)
        lines = [*self.head("planned"),
                 "    try:",
                 f"        __key = ({', '.join(parts)}, *__options.items())",
                 "        __bound = __self._fast.get(__key)",
                 "    except (AttributeError, TypeError):  # a tensor's place holds something else; an unhashable "
                 "value or option",
                 f"        return __self._general(__grid, {self.passed}, **__options)",
                 "    if __bound is None:",
                 f"        return __self._general(__grid, {self.passed}, __l1=__key, **__options)",
                 *self.tail(", ".join(launched))]
        return "\n".join(lines) + "\n", tuple(types)

    def compile(self, source: str, name: str) -> Callable[..., None]:
        namespace = _namespace(self.fn)
        namespace.update({"__H": _UNSET, "__missing": _missing, "__module": sys.modules[__name__],
                          "__base": self.fn, "__C": torch._C, "__runtime": knobs.runtime,
                          "__compilation": knobs.compilation, "__Chain": HookChain, "__hooked": _hooked,
                          "_Unkeyed": _Unkeyed})
        for depth, layer in enumerate(self.heuristics):
            for i, heur in enumerate(layer.values.values()):
                namespace[f"__h{depth}_{i}"] = heur
        exec(source, namespace)
        return namespace[name]


_UNSET: Final = object()  # a parameter not given (a heuristic sets it), in the generated `__call__`
_VALUES: Final = frozenset({int, float, bool, type(None)})  # the runtime arguments a planned key holds by value
_MAX_PLANNED: Final = 4096


def _missing(names: list[str], *values: Any) -> None:
    missing = [n for n, v in zip(names, values) if v is _UNSET]
    raise TypeError(f"missing required argument(s) {', '.join(map(repr, missing))}")


def _base(kernel: Any) -> tuple[Any, list[Heuristics]]:
    """The function under `kernel`'s heuristics, and the heuristics from the outermost in."""
    layers = []
    while isinstance(kernel, Heuristics):
        layers.append(kernel)
        kernel = kernel.fn
    return kernel, layers


class _Bound:
    """One specialization: the C launcher and what it is called with besides the grid, stream and arguments."""

    __slots__ = ("compiled", "launch", "prefix")

    def __init__(self, compiled: Any) -> None:
        from triton.backends.nvidia.driver import CudaLauncher

        launcher = compiled.run  # loads the binary (already loaded by the launch that compiled it)
        if not isinstance(launcher, CudaLauncher):
            raise _Unkeyed(type(launcher))
        self.compiled = compiled
        # CudaLauncher.__call__ adds its flags and the scratch buffers (None when their sizes are 0) before
        # the packed metadata; with no scratch the C launch is called directly
        if launcher.global_scratch_size == 0 and launcher.profile_scratch_size == 0:
            self.launch = launcher.launch
            self.prefix = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                           compiled.packed_metadata)
        else:
            self.launch = launcher
            self.prefix = (compiled.function, compiled.packed_metadata)


class Launcher:
    """`kernel` (a ``triton.jit`` function, optionally under ``triton.heuristics``) launched by
    ``launcher(grid, *args, **kwargs)`` as ``kernel[grid](*args, **kwargs)`` is, through the fast path of the
    module docstring where it applies: there the instance's class is a subclass made for it, whose ``__call__``
    is generated for the kernel's parameters (`_make_call`)."""

    __slots__ = ("_base", "_bind", "_cache", "_fast", "_heuristics", "_kernel", "_names", "_plain", "_planned",
                 "_source", "_types")

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel
        base, self._heuristics = _base(kernel)
        # the interpreter's kernels (InterpretedFunction) are not JITFunctions: always the plain launch
        self._plain = not isinstance(base, JITFunction) or not supported()
        self._base = base
        self._cache: dict[Hashable, _Bound] = {}  # by the exact key (`general`)
        self._fast: dict[Hashable, _Bound] = {}  # by the planned key (`planned`)
        self._planned = False
        self._types: tuple[int, ...] = ()
        self._bind = self._source = None
        self._names = tuple(base.signature.parameters) if isinstance(base, JITFunction) else ()
        if not self._plain:
            try:
                self._bind = _make_binder(base)
                self._source = _Source(base, self._heuristics)
                general = self._source.compile(self._source.general(), "general")
            except _Unkeyed:
                self._plain = True
                return
            self.__class__ = type(f"Launcher[{base.__name__}]", (Launcher,),
                                  {"__slots__": (), "__call__": general, "_general": general, "__module__": __name__})

    def clear(self) -> None:
        """Forget every kernel kept (the next call of each key goes through Triton again)."""
        self._cache.clear()
        self._fast.clear()

    def _plan(self, params: tuple[Any, ...]) -> None:
        """After the first hit: switch to the planned ``__call__`` for the tensors of this call's runtime
        arguments, when every other runtime argument is an int, float, bool or None (else stay general)."""
        self._planned = True
        assert self._source is not None
        runtime = [(p.name, v) for p, v in zip(self._source.fn.params, params) if not p.is_constexpr]
        if any(not isinstance(v, _Tensor) and type(v) not in _VALUES for _, v in runtime):
            return
        source, self._types = self._source.planned(frozenset(n for n, v in runtime if isinstance(v, _Tensor)))
        type(self).__call__ = self._source.compile(source, "planned")  # type: ignore[method-assign]

    def _remember(self, key: Hashable, bound: _Bound) -> None:
        """Keep `bound` under the planned `key` when the key's values are of the types it tells apart (a
        tensor where a value was planned never enters it); at most `_MAX_PLANNED` keys, then start over."""
        if all(key[i] in _VALUES for i in self._types):  # type: ignore[index]
            if len(self._fast) >= _MAX_PLANNED:
                self._fast.clear()
            self._fast[key] = bound

    @property
    def kernel(self) -> Any:
        """The kernel as given."""
        return self._kernel

    def key(self, *args: Any, **kwargs: Any) -> Hashable:
        """The specialization key of a call (device and debug knobs excluded), for tests."""
        if self._bind is None:
            raise RuntimeError(f"{self._base!r}: no fast path here")
        return self._bind(*args, **self._apply_heuristics(args, kwargs))[1]

    def _apply_heuristics(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        for layer in self._heuristics:  # as Heuristics.run, from the outermost in
            named = None  # the bound arguments, built once per layer (Triton builds them once per heuristic)
            for name, heur in layer.values.items():
                if named is None:
                    named = {**dict(zip(layer.arg_names, args)), **kwargs}
                value = kwargs[name] = heur(named)
                named[name] = value  # the next heuristic sees it, as in Triton
        return kwargs

    def __call__(self, grid: Any, /, *args: Any, **kwargs: Any) -> None:
        """Launch on `grid` (a tuple, or a function of the bound arguments' dict, as Triton takes)."""
        self._kernel[grid](*args, **kwargs)

    def _plain_call(self, grid: Any, named: dict[str, Any], options: dict[str, Any]) -> None:
        """The fast path's way out: launch through Triton, the parameters by name (those a heuristic sets and
        the caller did not give left out)."""
        self._kernel[grid](**{n: v for n, v in named.items() if v is not _UNSET}, **options)

    def _miss(self, key: Hashable, grid: Any, params: tuple[Any, ...], options: dict[str, Any]) -> None:
        """Launch through Triton (every parameter, the heuristics' values included) and keep the kernel it
        compiled (or found) for `key`."""
        compiled = self._base[grid](**dict(zip(self._names, params)), **options)
        if compiled is None or hasattr(compiled, "result"):  # a jit_cache_hook skipped it, or compiling async
            return
        try:
            self._cache[key] = _Bound(compiled)
        except _Unkeyed:
            self._plain = True  # not the CUDA launcher this module was written against
            self.__class__ = Launcher
            self.clear()


def _hooked(hook: Any) -> bool:
    """Whether a launch hook would do something (an empty HookChain does nothing)."""
    return hook is not None and bool(getattr(hook, "calls", True))
