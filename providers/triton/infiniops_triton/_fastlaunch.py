"""Triton kernels launched without Triton's per-call binding and specialization (issue #25).

``kernel[grid](...)`` in Triton 3.6 (``JITFunction.run``) binds every argument through a generated function,
specializes each one, turns the options into a string for its cache key, checks the kernel's globals, builds
a launch-metadata dict for the launch hooks and goes through two Python wrappers before the C launcher, all
of it on every call. `Launcher` keys each call on what decides the compiled binary, computed in Python from
the arguments themselves:

- each tensor: its dtype and whether ``data_ptr()`` is a multiple of 16 (Triton's pointer alignment);
- each int: 1 (Triton makes it a constant), otherwise whether it is a multiple of 16 and whether it fits
  int32 or int64 (the type Triton gives it); a bool, a float and None stand for their type;
- each constexpr's value, the options (``num_warps``, ``num_stages``, ``launch_pdl``, ...), the debug and
  instrumentation knobs, and the current device.

The first call of a key launches through Triton (``kernel[grid](...)``, which compiles as usual) and keeps
the `CompiledKernel` it returns; later calls pass the arguments, in the kernel's parameter order, constexprs
included (the 3.6 launcher skips them), straight to the C launcher with the current raw stream. The key is
finer than Triton's own (a parameter marked ``do_not_specialize`` still splits keys: one more compile at
worst, never a wrong binary); constexprs compare by value, as in Triton's own cache (``True == 1``).
Heuristics (``triton.heuristics``) are evaluated on every call, as Triton does. Chosen over
`CompiledKernel.__getitem__` (Triton's own direct launch), which builds a closure and the hooks' metadata on
every call (3.6's hook chains are never None, so ``launch_metadata`` always builds its dict), and over
binding with Triton's generated binder, which needs ``str(options)`` for its cache key on every call.

Launch hooks (``knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``) run as in Triton: with metadata
when a hook is registered, skipped (None) when the chains are empty. A kernel with ``pre_run_hooks`` always
launches through Triton. Not repeated on the fast path: the check that the kernel's global variables have
not changed since it was compiled (ours read module constants).

The fast path exists only where its calling convention was read in Triton's source: Triton 3.6.x with the
CUDA launcher. Everywhere else, under the interpreter (``TRITON_INTERPRET=1``), with
``INFINIOPS_TRITON_FASTLAUNCH=0``, or after `set_enabled(False)`, a `Launcher` is exactly
``kernel[grid](*args, **kwargs)``; so is a call with an argument the key does not know (any other type).
"""

from __future__ import annotations

import inspect
import os
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
    if isinstance(arg, _Tensor):  # a subclass (nn.Parameter)
        return arg.dtype, not arg.data_ptr() & 15
    raise _Unkeyed(kind)


def _make_binder(fn: JITFunction) -> Callable[..., tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """``bind(*args, **kwargs) -> (params, key)``: every parameter in order (defaults applied) and the key of
    the parameters and the remaining options, as Python binds a call (a TypeError names a missing argument)."""
    names = list(fn.signature.parameters)
    if any(n.startswith("__") for n in names):  # the generated function's own names start with two underscores
        raise _Unkeyed(names)
    decl = [n if p.default is inspect.Parameter.empty else f"{n}=__d_{n}" for n, p in fn.signature.parameters.items()]
    # a tensor's key inline (the common case: no call), anything else through arg_key
    keys = [p.name if p.is_constexpr else
            f"(({p.name}.dtype, not {p.name}.data_ptr() & 15) if {p.name}.__class__ is __T else __k({p.name}))"
            for p in fn.params]
    src = (f"def bind({', '.join([*decl, '**__options'])}):\n"
           f"    return ({', '.join(names)},), ({', '.join(keys)}, *__options.items())\n")
    namespace: dict[str, Any] = {f"__d_{n}": p.default for n, p in fn.signature.parameters.items()
                                 if p.default is not inspect.Parameter.empty}
    namespace["__k"], namespace["__T"] = arg_key, _Tensor
    exec(src, namespace)
    return namespace["bind"]


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
    module docstring where it applies."""

    __slots__ = ("_base", "_bind", "_cache", "_heuristics", "_kernel", "_names", "_plain")

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel
        base, self._heuristics = _base(kernel)
        # the interpreter's kernels (InterpretedFunction) are not JITFunctions: always the plain launch
        self._plain = not isinstance(base, JITFunction) or not supported()
        self._base = base
        self._cache: dict[Hashable, _Bound] = {}
        self._bind = None
        if not self._plain:
            try:
                self._bind = _make_binder(base)
            except _Unkeyed:
                self._plain = True
        self._names = tuple(base.signature.parameters) if isinstance(base, JITFunction) else ()

    @property
    def kernel(self) -> Any:
        """The kernel as given."""
        return self._kernel

    def key(self, *args: Any, **kwargs: Any) -> Hashable:
        """The specialization key of a call (device excluded), for tests."""
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
        if self._plain or not _enabled or self._base.pre_run_hooks:
            self._kernel[grid](*args, **kwargs)
            return
        if self._heuristics:
            kwargs = self._apply_heuristics(args, kwargs)
        try:
            params, key = self._bind(*args, **kwargs)
        except _Unkeyed:
            self._kernel[grid](*args, **kwargs)
            return
        device = torch._C._cuda_getDevice()
        key = (device, knobs.runtime.debug, knobs.compilation.instrumentation_mode, key)
        bound = self._cache.get(key)
        if bound is None:
            self._miss(key, grid, args, kwargs)
            return
        if callable(grid):
            grid = grid(dict(zip(self._names, params)))
        size = len(grid)
        grid_0 = grid[0]
        grid_1 = grid[1] if size > 1 else 1
        grid_2 = grid[2] if size > 2 else 1
        stream = torch._C._cuda_getCurrentRawStream(device)
        runtime = knobs.runtime
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        if (enter.__class__ is not HookChain or enter.calls or leave.__class__ is not HookChain
                or leave.calls) and (_hooked(enter) or _hooked(leave)):  # the common case: empty chains
            metadata = bound.compiled.launch_metadata(grid, stream, *params)
        else:
            metadata = enter = leave = None
        bound.launch(grid_0, grid_1, grid_2, stream, *bound.prefix, metadata, enter, leave, *params)

    def _miss(self, key: Hashable, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Launch through Triton and keep the kernel it compiled (or found) for `key`."""
        compiled = self._base[grid](*args, **kwargs)  # the heuristics are already in kwargs
        if compiled is None or hasattr(compiled, "result"):  # a jit_cache_hook skipped it, or compiling async
            return
        try:
            self._cache[key] = _Bound(compiled)
        except _Unkeyed:
            self._plain = True  # not the CUDA launcher this module was written against


def _hooked(hook: Any) -> bool:
    """Whether a launch hook would do something (an empty HookChain does nothing)."""
    return hook is not None and bool(getattr(hook, "calls", True))
