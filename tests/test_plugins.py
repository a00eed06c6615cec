"""Provider discovery: entry points, isolation of a broken plugin, the allow-list and autoload switch.

The example and broken plugins (tests/plugins/) are laid out as installed distributions in a temporary
folder (`example_plugins.plugin_site`) that only these tests put on ``PYTHONPATH`` (or ``sys.path``):
nothing is installed into the environment. Discovery is checked in fresh processes, as a user would
meet it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from example_plugins import CLONE, EXAMPLE, HOSTILE, IMPOSTOR, plugin_site
from fakes import correct_add, cpu_capability, fresh_env

import infiniops_py as io
from infiniops_py import Implementation, Provider, hookimpl
from infiniops_py.cli import main

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield plugin_site(tmp_path_factory.mktemp("plugins"))
    io.reload()


def _env(site: Path, **extra: str) -> dict[str, str]:
    """`fresh_env` with the plugin folder first on ``PYTHONPATH``."""
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return fresh_env(PYTHONPATH=path, **extra)


def _python(site: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=_env(site, **env), capture_output=True, text=True,
                          timeout=120)


def test_broken_plugin_is_listed_with_its_error(site: Path) -> None:
    run = subprocess.run([str(BIN / "infiniops"), "providers"], env=_env(site), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "failed to load" in next(line for line in lines if line.startswith("│ broken"))
    assert "loaded" in next(line for line in lines if line.startswith("│ example"))
    error = next(line for line in lines if line.startswith("broken failed to load:"))
    assert "ImportError: infiniops_broken: libexample_kernels.so not found" in error


def test_every_other_provider_still_resolves_and_runs(site: Path) -> None:
    code = """
import torch, infiniops_py as io
status = {p.name: p.error for p in io.providers()}
assert status["broken"].startswith("ImportError"), status
for name in ("example", "torch", "reference"):
    assert status[name] == "", (name, status[name])
    a, b = torch.randn(5), torch.randn(5)
    with io.use(name):
        assert io.resolve("add", device_type="cpu", dtype="float32").provider == name
        torch.testing.assert_close(io.add(a, b), a + b)
print("ok")
"""
    run = _python(site, code)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_allow_list_loads_only_the_named_plugins(site: Path) -> None:
    code = "import infiniops_py as io; print(sorted(p.name for p in io.providers()))"
    run = _python(site, code, INFINIOPS_PROVIDERS="example,broken")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['broken', 'example', 'meta', 'reference']"  # the built-ins always load


def test_autoload_switch_leaves_only_the_reference_and_hand_registered(site: Path) -> None:
    code = """
import infiniops_example, infiniops_py as io
print(sorted(p.name for p in io.providers()))
io.register_provider(infiniops_example, name="example")
print(sorted(p.name for p in io.providers()))
print(io.resolve("add", device_type="cpu", dtype="float16").provider)
"""
    run = _python(site, code, INFINIOPS_DISABLE_PLUGIN_AUTOLOAD="1")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:3] == ["['meta', 'reference']", "['example', 'meta', 'reference']", "example"]


def test_bad_plugins_registered_by_hand_carry_their_error() -> None:
    class NoHook:
        pass

    class WrongType:
        @io.hookimpl
        def infiniops_provider(self) -> object:
            return "not a provider"

    class Raises:
        @io.hookimpl
        def infiniops_provider(self) -> object:
            raise RuntimeError("kernel cache corrupt")

    try:
        assert "implements no infiniops_provider hook" in io.register_provider(NoHook(), name="nohook").error
        assert "returned str, not Provider" in io.register_provider(WrongType(), name="wrongtype").error
        assert "RuntimeError: kernel cache corrupt" in io.register_provider(Raises(), name="raises").error
        assert io.resolve("add", device_type="cpu", dtype="float32") is not None
    finally:
        for name in ("nohook", "wrongtype", "raises"):
            io.unregister_provider(name)


def _pytest(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=cwd, env=_env(site), capture_output=True, text=True, timeout=300)


def test_example_provider_passes_the_pytest_plugin_conformance(site: Path, tmp_path: Path) -> None:
    run = _pytest(site, tmp_path, "--infiniops-provider", "example", "--infiniops-max-examples", "15")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout  # add in float16 and float32, and its gate checks


def test_the_pytest_plugin_fails_a_provider_with_nothing_to_test(site: Path, tmp_path: Path) -> None:
    # zero collected items would pass: one failing item says why instead
    run = _pytest(site, tmp_path, "--infiniops-provider", "example", "--infiniops-device", "meta")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed" in run.stdout and "FAILED infiniops[example]::provider" in run.stdout
    assert ("provider 'example' serves nothing to test on meta: device_type=meta not in {cpu}: "
            "try --infiniops-device cpu") in run.stdout


def test_a_second_entry_point_under_a_taken_name_is_shown_as_a_clash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(plugin_site(tmp_path, EXAMPLE, CLONE)))
    monkeypatch.setenv("INFINIOPS_PROVIDERS", "example")
    try:
        io.reload()
        found = {p.name: p for p in io.providers()}
        assert sorted(found) == ["example", "example [infiniops-provider-example-clone]", "meta", "reference"]
        assert found["example"].loaded and found["example"].source.startswith("infiniops-provider-example 0.1.0")
        assert main(["providers"]) == 0
        out = capsys.readouterr().out
        assert ("example [infiniops-provider-example-clone] failed to load: duplicate provider name 'example': "
                "also provided by infiniops-provider-example 0.1.0 (entry point example = infiniops_example)") in out
    finally:
        monkeypatch.undo()
        io.reload()



class _CallsItself:
    """A plugin object whose provider is named `name` (whatever it is registered as) and claims torch's source."""

    def __init__(self, name: str) -> None:
        self.name = name

    @hookimpl
    def infiniops_provider(self) -> Provider:
        impl = Implementation("add", self.name, f"{self.name}.add", cpu_capability(), 10_000, correct_add)
        return Provider(name=self.name, source="infiniops-provider-torch 0.1.0", implementations=[impl])


def test_no_plugin_can_take_another_providers_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # the impostor distribution sorts first and calls itself torch under entry points aaahijack, torch, reference
    monkeypatch.syspath_prepend(str(plugin_site(tmp_path, IMPOSTOR)))
    monkeypatch.delenv("INFINIOPS_PROVIDERS", raising=False)
    caplog.set_level(logging.WARNING, logger="infiniops")
    try:
        io.reload()
        found = {p.name: p for p in io.providers()}
        assert not found["aaahijack"].loaded
        assert ("the provider is named 'torch', but it is registered as 'aaahijack': a provider's name must equal "
                "its entry point's name") in found["aaahijack"].error
        assert found["torch"].loaded and found["torch"].source.startswith("infiniops-provider-torch 0.1.0")
        assert found["reference"].loaded and found["reference"].source == "built into infiniops-py"
        for name, holder in (("torch", "infiniops-provider-torch 0.1.0"), ("reference", "the built-in provider")):
            refused = found[f"{name} [aaa-infiniops-impostor]"]
            assert not refused.loaded and not refused.implementations
            assert refused.error.startswith(f"duplicate provider name {name!r}: also provided by {holder}")
            assert f"(entry point {name} = infiniops_impostor) refused: duplicate provider name" in caplog.text
        a, b = torch.randn(9), torch.randn(9)
        torch.testing.assert_close(io.add(a, b), a + b, rtol=1e-6, atol=1e-6)  # not the impostor's a - b
        assert io.resolve("add", device_type="cpu", dtype="float32").provider == "torch"

        # by hand: a name that is given must be the provider's own; a loaded provider's name stays refused
        renamed = io.register_provider(_CallsItself("other"), name="mine")
        assert renamed.name == "mine" and not renamed.loaded
        assert "the provider is named 'other', but it is registered as 'mine'" in renamed.error
        own = io.register_provider(_CallsItself("honest"), name="honest")
        assert own.loaded and own.source == "manual"  # where it came from, not what it claims
        io.unregister_provider("honest")
        taken = io.register_provider(_CallsItself("torch"), name="torch")
        assert taken.name == "torch [manual]" and not taken.loaded
        assert io.resolve("add", device_type="cpu", dtype="float32").provider == "torch"
        torch.testing.assert_close(io.add(a, b), a + b, rtol=1e-6, atol=1e-6)
    finally:
        io.unregister_provider("mine")
        io.unregister_provider("torch")
        monkeypatch.undo()
        io.reload()


def test_no_plugin_can_end_crash_or_garble_the_host(tmp_path: Path) -> None:
    site = plugin_site(tmp_path, HOSTILE)
    run = subprocess.run([str(BIN / "infiniops"), "matrix", "--op", "add", "--device", "cpu", "--format", "json"],
                         env=_env(site), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)  # stdout holds the JSON alone: the plugin's prints went to stderr
    assert "chatty: imported" in run.stderr and "chatty: hook called" in run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    errors = {p["name"]: p["error"] for p in data["providers"]}
    assert errors["exits"] == "SystemExit: 3"
    assert errors["interrupts"] == "KeyboardInterrupt"
    assert "implementations is a generator, not a list or tuple of Implementation" in errors["generator"]
    assert "constraint 2 (Mute): describe() returned int 5, not a str" in errors["baddescribe"]
    assert "capability is Sneaky, not a Capability" in errors["overrides"]
    assert errors["stringy"] == errors["chatty"] == ""
    add = next(op for op in data["operators"] if op["name"] == "add")
    stringy = next(row for row in add["providers"] if row["provider"] == "stringy")
    assert all("(constraint stringy returned str, not a Rejection or None)" in "; ".join(cell["reasons"])
               for cell in stringy["cells"])

    code = """
import torch, infiniops_py as io
from infiniops_py.cli import main
assert main(["providers"]) == 0
ex = io.explain("add", device_type="cpu", dtype="float32")
stringy = next(c for c in ex.candidates if c.provider == "stringy")
assert "(constraint stringy returned str, not a Rejection or None)" in str(stringy.rejections[0]), ex.render()
assert ex.chosen is not None and ex.chosen.provider != "stringy"
a, b = torch.randn(5), torch.randn(5)
torch.testing.assert_close(io.add(a, b), a + b, rtol=1e-6, atol=1e-6)
with io.use("stringy"):
    try:
        io.resolve("add", device_type="cpu", dtype="float32")
    except io.GateError as err:
        assert "returned str, not a Rejection or None" in str(err), err
    else:
        raise AssertionError("stringy served add")
print("ok")
"""
    run = _python(site, code)
    assert run.returncode == 0 and run.stdout.rstrip().endswith("ok"), run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_a_plugin_built_for_another_provider_api_fails_to_load_naming_both_versions() -> None:
    from infiniops_py import hookspecs, plugins

    class Built:
        def __init__(self, api: int | None) -> None:
            self.api = api

        @hookimpl
        def infiniops_provider(self) -> Provider:
            impl = Implementation("add", "mine", "mine.add", cpu_capability(), 1, correct_add)
            return Provider(name="mine", implementations=[impl], api_version=self.api)

    other = plugins.load_plugin(Built(hookspecs.PROVIDER_API + 1), name="mine", source="test")
    assert not other.loaded and not other.implementations
    assert f"built for provider API {hookspecs.PROVIDER_API + 1}" in other.error
    assert f"has provider API {hookspecs.PROVIDER_API}" in other.error and io.__version__ in other.error
    for api in (hookspecs.PROVIDER_API, None):  # the same one, or none declared
        assert plugins.load_plugin(Built(api), name="mine", source="test").loaded
    assert {p.name: p.api_version for p in io.providers()}.get("torch") == hookspecs.PROVIDER_API


def test_what_a_plugin_declares_is_read_once_so_what_is_checked_is_what_serves() -> None:
    """A list subclass that yields valid declarations to the checks and another provider's implementation to
    the registry is refused; the torch provider keeps serving add."""
    from infiniops_py import plugins

    def impostor(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
        return out.fill_(666.0)

    class Shifty(list):
        reads = 0

        def __iter__(self) -> Iterator[Implementation]:
            Shifty.reads += 1
            if Shifty.reads == 1:
                return iter([Implementation("add", "shifty", "shifty.add", cpu_capability(), 1, correct_add)])
            return iter([Implementation("add", "torch", "torch.add", cpu_capability(), 10**6, impostor)])

    class Plugin:
        @hookimpl
        def infiniops_provider(self) -> Provider:
            return Provider(name="shifty", implementations=Shifty())

    loaded = plugins.load_plugin(Plugin(), name="shifty", source="test")
    assert not loaded.loaded and "not a list or tuple" in loaded.error
    assert all(i.provider == "shifty" for i in loaded.implementations)
    try:
        io.register_provider(Plugin(), name="shifty")
        with io.use("torch", op="add"):
            assert io.add(torch.ones(2), torch.ones(2)).tolist() == [2.0, 2.0]
    finally:
        io.unregister_provider("shifty")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise SystemExit(7)


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), SystemExit(3), GeneratorExit(), _Unprintable()],
                         ids=["KeyboardInterrupt", "SystemExit", "GeneratorExit", "unprintable"])
def test_a_constraint_that_raises_anything_when_checked_is_a_rejection_of_its_own(raised: BaseException) -> None:
    from infiniops_py import Constraint
    from infiniops_py.errors import Rejection

    class Evil(Constraint):
        field = "broadcast"
        environmental = False

        def reject(self, problem: object) -> Rejection | None:
            raise raised

        def describe(self) -> str:
            return "evil"

    class Plugin:
        @hookimpl
        def infiniops_provider(self) -> Provider:
            cap = cpu_capability(Evil())
            return Provider(name="evil", implementations=[Implementation("add", "evil", "evil.add", cap, 10**6,
                                                                         correct_add)])

    try:
        assert io.register_provider(Plugin(), name="evil").loaded
        assert io.add(torch.ones(2), torch.ones(2)).tolist() == [2.0, 2.0]  # torch serves; evil rejects itself
        report = io.explain("add", device_type="cpu", dtype="float32").render()
        assert "constraint evil raised" in report and type(raised).__name__ in report
    finally:
        io.unregister_provider("evil")


def test_provider_from_modules_gathers_each_module_in_order_with_the_installed_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper the bundled providers build themselves with: every module's IMPLEMENTATIONS in the order given,
    the distribution's version (0+unknown when none is installed), the declared API; a missing module raises."""
    from importlib.metadata import version

    from infiniops_py.operators import FAMILIES
    from infiniops_py.registry import provider_from_modules

    package = tmp_path / "fake_provider_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for op in ("gemm", "add"):
        (package / f"{op}.py").write_text(
            "from fakes import correct_add, cpu_capability\nfrom infiniops_py import Implementation\n"
            f"IMPLEMENTATIONS = [Implementation({op!r}, 'fake', 'fake.{op}', cpu_capability(), 1, correct_add)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    built = provider_from_modules("fake", "fake_provider_pkg", ["add", "gemm"], api_version=7)
    assert [i.name for i in built.implementations] == ["fake.add", "fake.gemm"]
    assert (built.name, built.version, built.api_version, built.error) == ("fake", "0+unknown", 7, "")
    installed = provider_from_modules("fake", "fake_provider_pkg", [], api_version=1, distribution="pluggy")
    assert installed.version == version("pluggy") and not installed.implementations
    with pytest.raises(ModuleNotFoundError):
        provider_from_modules("fake", "fake_provider_pkg", ["rms_norm"], api_version=1)
    torch_provider = {p.name: p for p in io.providers()}["torch"]
    assert sorted({i.op for i in torch_provider.implementations}) == sorted(io.OPERATORS)
    assert FAMILIES[:2] == ("gemm", "add") and len(FAMILIES) == len(set(FAMILIES)) == 17
