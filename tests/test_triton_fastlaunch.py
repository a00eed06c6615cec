"""`infiniops_triton._fastlaunch` on the CPU: its key separates exactly what Triton 3.6 specializes, its bound
arguments are the ones Triton's launcher gets, it falls back where it must, and a hit calls the C launcher
with what ``JITFunction.run`` would pass (a fake launcher records it). tests/test_triton_fastlaunch_gpu.py
runs the kernels."""

from __future__ import annotations

import importlib
import itertools
import operator
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from infiniops_triton import _fastlaunch
from infiniops_triton._fastlaunch import Launcher, arg_key, supported
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

pytestmark = pytest.mark.skipif(not triton.__version__.startswith("3.6."), reason="the fast path is for Triton 3.6")

_BACKEND = make_backend(GPUTarget("cuda", 90, 32))

# every launcher switched to the fast path, as module.attribute
SWITCHED = ("rms_norm._RMS_NORM", "rms_norm._FUSED_ADD_RMS_NORM", "silu_and_mul._SILU_AND_MUL",
            "fused_qk_norm_rope._QK_NORM_ROPE", "paged_cache._RESHAPE_AND_CACHE", "_gemv._GEMV._inner",
            "flash_attn._DECODE._inner", "flash_attn._DECODE_FIXED", "flash_attn._PREFILL._inner",
            "flash_attn._APPEND_KV", "flash_attn._COMBINE",
            "gemm._GEMM._inner", "add._ADD", "add._ADD_FLAT", "add._add_flat_tuned._inner", "rotary_embedding._ROTARY",
            "fused_qk_norm._QK_NORM", "causal_conv1d._UPDATE", "state_update._STATE_UPDATE",
            "causal_conv1d._CHANNEL_LAST", "causal_conv1d._CHANNEL_FIRST", "causal_conv1d._CONV",
            "causal_conv1d._CONV_UNIT_L", "causal_conv1d._CHANNEL_FIRST_TUNED._inner", "rms_norm_gated._RMS_NORM_GATED",
            "sampling._SAMPLE")


def switched_launchers() -> list[Launcher]:
    """The `Launcher` objects of `SWITCHED`."""
    found = []
    for path in SWITCHED:
        module, attribute = path.split(".", 1)
        found.append(operator.attrgetter(attribute)(importlib.import_module(f"infiniops_triton.{module}")))
    return found


@triton.jit
def _toy(X, Y, n, scale, flag, MODE: tl.constexpr, BLOCK: tl.constexpr = 64):
    pid = tl.program_id(0)
    tl.store(Y + pid, tl.load(X + pid) * scale + n + flag + MODE + BLOCK)


def _specialize(arg: Any, specialize: bool = True, align: bool = True) -> Any:
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    return native_specialize_impl(BaseBackend, arg, False, specialize, align)


def _runtime_args() -> list[Any]:
    base = torch.zeros(64, dtype=torch.float16)
    tensors = [base, base[1:], base[8:], base.float(), base.float()[2:], base.to(torch.bfloat16),
               torch.zeros(4, dtype=torch.int64), torch.zeros(8, dtype=torch.bool)]
    ints = [1, 0, 2, 15, 16, 17, 32, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -2**31, -2**31 - 16,
            2**63 - 16, 2**63, 2**63 + 16]
    return [*tensors, *ints, 0.5, 1.0, 16.0, True, False, None]


def test_the_key_of_an_argument_splits_exactly_where_triton_specializes() -> None:
    args = _runtime_args()
    for a, b in itertools.combinations(args, 2):
        same_key = arg_key(a) == arg_key(b) and type(arg_key(a)) is type(arg_key(b))
        assert same_key == (_specialize(a) == _specialize(b)), (a, b, arg_key(a), arg_key(b))
    for a in args:  # Triton's coarser specializations (do_not_specialize, ..._on_alignment) never split finer
        for b in args:
            if arg_key(a) == arg_key(b):
                assert _specialize(a, False, True) == _specialize(b, False, True)
                assert _specialize(a, True, False) == _specialize(b, True, False)


def test_a_one_and_a_true_and_a_tensor_subclass_keep_their_own_keys() -> None:
    assert arg_key(1) != arg_key(True) and arg_key(1.0) != arg_key(1)
    p = torch.nn.Parameter(torch.zeros(4))
    assert arg_key(p) == arg_key(torch.zeros(4)) == torch.float32  # aligned: the dtype alone
    assert arg_key(torch.zeros(4)[1:]) == (torch.float32,)
    with pytest.raises(_fastlaunch._Unkeyed):
        arg_key(torch.float16)


@triton.jit
def _one(X):
    tl.store(X, 0)


def test_the_inlined_key_of_the_generated_functions_is_arg_key() -> None:
    bind = _fastlaunch._make_binder(_one)
    for arg in _runtime_args():
        key = bind(arg)[1][0]
        assert key == arg_key(arg) and type(key) is type(arg_key(arg)), arg
    p = torch.nn.Parameter(torch.zeros(4))
    assert bind(p)[1][0] == arg_key(p)


def test_the_bound_parameters_are_what_tritons_binder_passes_to_the_launcher() -> None:
    binder = create_function_from_signature(_toy.signature, _toy.params, _BACKEND)
    x = torch.zeros(8)
    calls = [((x, x, 3, 0.5, True), {"MODE": 2}), ((x, x), {"n": 1, "scale": 2.0, "flag": False, "MODE": 0,
                                                           "BLOCK": 32, "num_warps": 2})]
    bind = _fastlaunch._make_binder(_toy)
    for args, kwargs in calls:
        bound, _, options = binder(*args, **kwargs)
        params, key = bind(*args, **kwargs)
        assert params == tuple(bound.values())
        assert key[len(params):] == tuple(options.items())  # the options follow one entry per parameter


def test_the_key_follows_constexprs_options_alignment_and_the_value_one() -> None:
    launcher = Launcher(_toy)
    x = torch.zeros(64)
    base = launcher.key(x, x, 3, 0.5, True, MODE=1)
    assert launcher.key(x, x, n=3, scale=0.5, flag=True, MODE=1) == base  # keywords bind as positionals
    assert launcher.key(x, x, 5, 2.5, False, MODE=1, BLOCK=64) == base  # the default, other values
    for other in (launcher.key(x[1:], x, 3, 0.5, True, MODE=1), launcher.key(x, x, 1, 0.5, True, MODE=1),
                  launcher.key(x, x, 16, 0.5, True, MODE=1), launcher.key(x, x, 3, 0.5, True, MODE=2),
                  launcher.key(x, x, 3, 0.5, True, MODE=1, BLOCK=32), launcher.key(x.half(), x, 3, 0.5, True, MODE=1),
                  launcher.key(x, x, 3, 0.5, True, MODE=1, num_warps=8)):
        assert other != base


def test_heuristics_are_evaluated_into_the_key() -> None:
    tuned = triton.heuristics({"MODE": lambda args: args["n"] % 4})(_toy)
    launcher = Launcher(tuned)
    x = torch.zeros(64)
    assert launcher.key(x, x, 5, 0.5, True)[5] == 1
    assert launcher.key(x, x, 6, 0.5, True)[5] == 2


def test_a_heuristic_sees_the_values_of_those_before_it_as_in_triton() -> None:
    seen: list[dict[str, Any]] = []

    def block(args: dict[str, Any]) -> int:
        seen.append(dict(args))
        return 32 if args["MODE"] == 1 else 64

    tuned = triton.heuristics({"MODE": lambda args: args["n"] % 4, "BLOCK": block})(_toy)
    x = torch.zeros(64)
    key = Launcher(tuned).key(x, x, 5, 0.5, True)
    assert key[5:7] == (1, 32) and seen[0]["MODE"] == 1 and seen[0]["n"] == 5 and seen[0]["X"] is x


def test_a_tuned_hit_calls_a_grid_with_the_chosen_configuration() -> None:
    from infiniops_triton._launch import Tuned

    launches: list[tuple[Any, ...]] = []
    tuned = Tuned(triton.autotune([triton.Config({"BLOCK": 32})], key=["n"])(_toy))
    tuned._chosen["k"] = {"BLOCK": 32, "num_warps": 4}
    tuned._inner = lambda grid, *args, **kwargs: launches.append((grid, args, kwargs))
    x = torch.zeros(64)
    tuned.launch("k", lambda meta: (64 // meta["BLOCK"], meta["num_warps"]), x, x, 3, 0.5, True, MODE=1)
    tuned.launch("k", (7,), x, x, 3, 0.5, True, MODE=1)
    assert [g for g, _, _ in launches] == [(2, 4), (7,)]
    assert launches[0][2] == {"MODE": 1, "BLOCK": 32, "num_warps": 4}


def test_the_switched_kernels_bind_as_triton_does() -> None:
    for launcher in switched_launchers():
        assert not launcher._plain, launcher.kernel
        kernel = launcher._base
        binder = create_function_from_signature(kernel.signature, kernel.params, _BACKEND)
        given = {p.name: 16 if p.is_constexpr else torch.zeros(1) for p in kernel.params if not p.has_default}
        bound, _, options = binder(**given, num_warps=4)
        params, key = launcher._bind(**given, num_warps=4)
        assert params == tuple(bound.values()), kernel  # every parameter, defaults applied, in order
        assert key[len(params):] == tuple(options.items())


def test_the_fallback_decision() -> None:
    assert supported("3.6.0", {})
    assert supported("3.6.1", {"TRITON_INTERPRET": "0"})
    assert not supported("3.7.0", {})  # a version whose launcher was not read
    assert not supported("3.5.1", {})
    assert not supported("3.6.0", {"TRITON_INTERPRET": "1"})
    assert not supported("3.6.0", {"INFINIOPS_TRITON_FASTLAUNCH": "0"})
    assert not supported("3.6.0", {"INFINIOPS_TRITON_FASTLAUNCH": " Off"})
    assert supported("3.6.0", {"INFINIOPS_TRITON_FASTLAUNCH": "1"})


class _Recorder:
    """A kernel-like object: ``k[grid](*args, **kwargs)`` records the call and returns `returns`."""

    def __init__(self, returns: Any = None) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self.returns = returns
        self.pre_run_hooks: list[Any] = []

    def __getitem__(self, grid: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((grid, args, kwargs))
            return self.returns

        return run


def test_an_interpreted_kernel_always_takes_the_plain_launch() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = InterpretedFunction(_toy.fn)
    assert Launcher(interpreted)._plain
    recorder = _Recorder()
    launcher = Launcher(recorder)  # not a JITFunction: plain
    launcher((3,), 1, 2, MODE=4)
    assert recorder.calls == [((3,), (1, 2), {"MODE": 4})]


def test_an_unknown_version_or_the_switch_gives_the_plain_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert Launcher(_toy)._plain
    monkeypatch.undo()
    monkeypatch.setattr(_fastlaunch, "_enabled", _fastlaunch._enabled)  # restored after the test
    monkeypatch.setenv("INFINIOPS_TRITON_FASTLAUNCH", "0")
    assert Launcher(_toy)._plain
    _fastlaunch.set_enabled(True)
    assert not _fastlaunch.enabled()  # supported() is false: it stays off
    monkeypatch.delenv("INFINIOPS_TRITON_FASTLAUNCH")
    _fastlaunch.set_enabled(True)
    assert _fastlaunch.enabled() and _fastlaunch.set_enabled(False) and not _fastlaunch.enabled()


class _FakeCudaLauncher:
    """Stands for triton.backends.nvidia.driver.CudaLauncher (only its attributes are read)."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = False
    launch_pdl = True

    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []
        self.launch = lambda *a: self.launches.append(a)


class _FakeCompiled:
    function = 1234
    packed_metadata = (4, 1, 0)

    def __init__(self) -> None:
        self.run = _FakeCudaLauncher()


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.backends.nvidia import driver

    monkeypatch.setattr(driver, "CudaLauncher", _FakeCudaLauncher)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 777 + device, raising=False)
    monkeypatch.setattr(_fastlaunch, "_enabled", True)


def test_a_hit_calls_the_c_launcher_with_what_triton_passes(fake_cuda: None) -> None:
    launcher = Launcher(_toy)
    compiled = _FakeCompiled()
    recorder = _Recorder(compiled)
    launcher._base = recorder  # the miss launches through this "Triton", which returns the compiled kernel
    x, y = torch.zeros(64), torch.zeros(64)
    launcher((2,), x, y, 3, 0.5, True, MODE=1)
    assert len(recorder.calls) == 1 and compiled.run.launches == []  # the miss went through Triton
    launcher(lambda meta: (meta["n"], meta["BLOCK"]), y, x, 5, 1.5, False, MODE=1)  # same key: a hit
    assert len(recorder.calls) == 1
    assert compiled.run.launches == [(5, 64, 1, 777, 1234, False, True, None, None, (4, 1, 0), None, None, None,
                                      y, x, 5, 1.5, False, 1, 64)]
    launcher((2,), x[1:], y, 3, 0.5, True, MODE=1)  # misaligned: another key, through Triton again
    launcher((2,), x, y, 1, 0.5, True, MODE=1)  # n == 1: another key
    assert len(recorder.calls) == 3 and len(compiled.run.launches) == 1


def test_launch_hooks_get_the_metadata_triton_builds(fake_cuda: None) -> None:
    from triton import knobs

    launcher = Launcher(_toy)
    compiled = _FakeCompiled()
    compiled.launch_metadata = lambda grid, stream, *args: ("md", grid, stream, len(args))
    launcher._base = _Recorder(compiled)
    x = torch.zeros(64)
    launcher((2,), x, x, 3, 0.5, True, MODE=1)
    seen: list[Any] = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        launcher((2, 3), x, x, 3, 0.5, True, MODE=1)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    launch = compiled.run.launches[0]
    assert launch[10] == ("md", (2, 3), 777, 7)
    assert launch[11] is knobs.runtime.launch_enter_hook and launch[12] is knobs.runtime.launch_exit_hook


def test_a_disabled_launcher_and_an_unkeyed_argument_launch_through_triton(fake_cuda: None,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = Launcher(_toy)
    recorder = _Recorder(_FakeCompiled())
    launcher._kernel = launcher._base = recorder
    x = torch.zeros(64)
    launcher((2,), x, x, 3, 0.5, True, MODE=1)
    monkeypatch.setattr(_fastlaunch, "_enabled", False)
    launcher((2,), x, x, 3, 0.5, True, MODE=1)
    monkeypatch.setattr(_fastlaunch, "_enabled", True)
    launcher((2,), x, x, 3, 0.5, torch.tensor(1.0).numpy(), MODE=1)  # a numpy scalar: not keyed
    assert len(recorder.calls) == 3


def test_raw_stream_off_cuda_is_zero() -> None:
    from infiniops_triton._common import raw_stream

    assert raw_stream(torch.device("cpu")) == 0


def test_a_hit_under_heuristics_launches_their_values(fake_cuda: None) -> None:
    tuned = triton.heuristics({"MODE": lambda args: args["n"] % 4})(_toy)
    launcher = Launcher(tuned)
    compiled = _FakeCompiled()
    recorder = _Recorder(compiled)
    launcher._base = recorder
    x = torch.zeros(64)
    launcher((2,), x, x, 5, 0.5, True)
    assert recorder.calls[0][2]["MODE"] == 1  # the miss passes the heuristic's value to Triton
    launcher((3,), x, x, 9, 0.5, True, BLOCK=64)  # 9 % 4 == 5 % 4, BLOCK its default: the same key
    launcher((3,), x, x, 6, 0.5, True)  # MODE 2: another key
    assert len(recorder.calls) == 2
    assert compiled.run.launches == [(3, 1, 1, 777, 1234, False, True, None, None, (4, 1, 0), None, None, None,
                                      x, x, 9, 0.5, True, 1, 64)]


def test_the_generated_call_binds_as_python_does(fake_cuda: None) -> None:
    tuned = triton.heuristics({"MODE": lambda args: 1})(_toy)
    launcher = Launcher(tuned)
    assert type(launcher) is not Launcher and isinstance(launcher, Launcher)
    recorder = _Recorder()
    launcher._base = recorder
    x = torch.zeros(64)
    with pytest.raises(TypeError, match="flag"):
        launcher((1,), x, x, 3, 0.5)  # flag missing
    with pytest.raises(TypeError):
        launcher((1,), x, x, 3, 0.5, True, n=4)  # n twice
    with pytest.raises(TypeError):
        launcher((1,), x, x, 3, 0.5, True, 1, 64, 99)  # one positional too many
    launcher((1,), x, x, flag=False, scale=0.5, n=3)
    assert recorder.calls[0][2] == {"X": x, "Y": x, "n": 3, "scale": 0.5, "flag": False, "MODE": 1, "BLOCK": 64}


def test_a_disabled_generated_call_gives_triton_what_the_caller_gave(fake_cuda: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    tuned = triton.heuristics({"MODE": lambda args: 1})(_toy)
    launcher = Launcher(tuned)
    recorder = _Recorder()
    launcher._kernel = recorder
    monkeypatch.setattr(_fastlaunch, "_enabled", False)
    x = torch.zeros(64)
    launcher((1,), x, x, 3, 0.5, True, num_warps=2)
    assert recorder.calls == [((1,), (), {"X": x, "Y": x, "n": 3, "scale": 0.5, "flag": True, "BLOCK": 64,
                                          "num_warps": 2})]


def test_after_the_first_hit_the_planned_call_launches_addresses(fake_cuda: None) -> None:
    launcher = Launcher(_toy)
    compiled = _FakeCompiled()
    recorder = _Recorder(compiled)
    launcher._base = recorder
    x, y = torch.zeros(64), torch.zeros(64)
    launcher((2,), x, y, 3, 0.5, True, MODE=1)  # a miss: through Triton
    launcher((2,), x, y, 3, 0.5, True, MODE=1)  # the first hit, exactly keyed: the plan is made
    assert type(launcher).__call__.__name__ == "planned"
    launcher((4,), y, x, 3, 0.5, True, MODE=1)  # a planned miss (a new key), found exactly, remembered
    launcher((4,), y, x, 3, 0.5, True, MODE=1)  # a planned hit
    assert len(recorder.calls) == 1 and len(launcher._fast) == 1
    tail = (None, None, None, 3, 0.5, True, 1, 64)
    assert compiled.run.launches == [
        (2, 1, 1, 777, 1234, False, True, None, None, (4, 1, 0), None, None, None, x, y, 3, 0.5, True, 1, 64),
        (4, 1, 1, 777, 1234, False, True, None, None, (4, 1, 0), None, None, None, y, x, 3, 0.5, True, 1, 64),
        (4, 1, 1, 777, 1234, False, True, None, None, (4, 1, 0), *tail[:3], y.data_ptr(), x.data_ptr(), *tail[3:])]


@pytest.mark.parametrize("other", [True, 3.0, 17, 1, None, -5, 2**31, 2**40 + 16])
def test_a_planned_key_never_mixes_values_of_another_type_or_class(fake_cuda: None, other: Any) -> None:
    launcher = Launcher(_toy)
    launcher._base = _Recorder(_FakeCompiled())
    x = torch.zeros(64)
    for _ in range(3):
        launcher((1,), x, x, 16, 0.5, True, MODE=1)
    launcher((1,), x, x, other, 0.5, True, MODE=1)  # `n` of another type or Triton class: the exact key decides
    exact = {launcher.key(x, x, 16, 0.5, True, MODE=1), launcher.key(x, x, other, 0.5, True, MODE=1)}
    assert len(launcher._base.calls) == len(exact)  # one Triton launch per exact key, no more, no fewer


def test_a_planned_call_given_a_tensor_for_a_value_or_none_for_a_tensor_stays_exact(fake_cuda: None) -> None:
    launcher = Launcher(_toy)
    recorder = _Recorder(_FakeCompiled())
    launcher._base = recorder
    x = torch.zeros(64)
    for _ in range(3):
        launcher((1,), x, x, 16, 0.5, True, MODE=1)
    launcher((1,), x, x, 16, torch.zeros(2), True, MODE=1)  # a tensor for `scale`: another exact key
    launcher((1,), x, x, 16, torch.zeros(2), True, MODE=1)
    launcher((1,), None, x, 16, 0.5, True, MODE=1)  # None for `X`: the general call
    assert len(recorder.calls) == 3 and len(launcher._fast) == 1  # no tensor kept in a planned key


@triton.jit
def _shadowing(X, len):
    tl.store(X, len)


def test_a_parameter_named_like_what_the_generated_call_reads_takes_the_plain_launch() -> None:
    launcher = Launcher(_shadowing)
    assert launcher._plain and type(launcher) is Launcher


def test_an_unhashable_argument_or_option_launches_through_triton(fake_cuda: None) -> None:
    # Triton keys its options by their str (a dict option, CUDAOptions.extern_libs, is fine there) and hands a list
    # argument to its own specialization: neither may raise an unhashable TypeError in the key lookups
    launcher = Launcher(_toy)
    recorder = _Recorder(_FakeCompiled())
    launcher._kernel = launcher._base = recorder
    x = torch.zeros(64)
    libs = {"libdevice": "/path/libdevice.bc"}
    launcher((1,), x, x, 3, 0.5, True, MODE=1, extern_libs=libs)  # general
    for _ in range(2):
        launcher((1,), x, x, 3, 0.5, True, MODE=1)  # a miss, then the first hit: planned from here on
    assert type(launcher).__call__.__name__ == "planned"
    launcher((1,), x, x, 3, 0.5, True, MODE=1, extern_libs=libs)  # planned
    launcher((1,), x, x, [3], 0.5, True, MODE=1)  # a list where an int was planned
    assert [c[2].get("extern_libs") for c in recorder.calls] == [libs, None, libs, None]
    assert recorder.calls[-1][2]["n"] == [3]


@pytest.mark.parametrize("enabled", [True, False])
def test_a_parameter_a_heuristic_sets_given_positionally_is_a_type_error_as_in_triton(
        fake_cuda: None, monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
    # Heuristics.run passes the heuristic's value by keyword, so a positional argument that reaches its parameter
    # (or one after it) is Python's "multiple values" TypeError in Triton; the generated call must not take it
    tuned = triton.heuristics({"MODE": lambda args: 1})(_toy)
    launcher = Launcher(tuned)
    recorder = _Recorder(_FakeCompiled())
    launcher._kernel = launcher._base = recorder
    monkeypatch.setattr(_fastlaunch, "_enabled", enabled)
    x = torch.zeros(64)
    binder = create_function_from_signature(_toy.signature, _toy.params, _BACKEND)
    with pytest.raises(TypeError, match="multiple values"):  # what JITFunction.run binds after Heuristics.run
        binder(x, x, 3, 0.5, True, 2, MODE=1)
    for _ in range(3):  # the general call, then the planned one
        with pytest.raises(TypeError):
            launcher((1,), x, x, 3, 0.5, True, 2)
        launcher((1,), x, x, 3, 0.5, True, MODE=2, BLOCK=64)  # by keyword: the heuristic's value wins, as in Triton
    assert len(recorder.calls) == (1 if enabled else 3)  # then hits; off: each by name through "Triton"
    assert not enabled or recorder.calls[0][2]["MODE"] == 1
