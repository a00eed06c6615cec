"""Provider discovery: entry points, isolation of a broken plugin, the allow-list and autoload switch.

The example and broken plugins (tests/plugins/) are laid out as installed distributions in a temporary
folder (`example_plugins.plugin_site`) that only these tests put on ``PYTHONPATH`` (or ``sys.path``):
nothing is installed into the environment. Discovery is checked in fresh processes, as a user would
meet it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from example_plugins import CLONE, EXAMPLE, plugin_site
from fakes import fresh_env

import infiniops_py as io
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
    assert run.stdout.strip() == "['broken', 'example', 'reference']"


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
    assert run.stdout.split("\n")[:3] == ["['reference']", "['example', 'reference']", "example"]


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
        assert sorted(found) == ["example", "example [infiniops-provider-example-clone]", "reference"]
        assert found["example"].loaded and found["example"].source.startswith("infiniops-provider-example 0.1.0")
        assert main(["providers"]) == 0
        out = capsys.readouterr().out
        assert ("example [infiniops-provider-example-clone] failed to load: duplicate provider name 'example': "
                "also provided by infiniops-provider-example 0.1.0 (entry point example = infiniops_example)") in out
    finally:
        monkeypatch.undo()
        io.reload()

