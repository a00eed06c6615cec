"""Provider discovery: entry points, isolation of a broken plugin, the allow-list and autoload switch.

The example and broken plugins (tests/plugins/) are installed editable once; discovery is checked in
fresh processes, as a user would meet it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from example_plugins import ensure_installed
from fakes import fresh_env

import infiniops_py as io

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module", autouse=True)
def _plugins() -> Iterator[None]:
    ensure_installed()
    yield
    io.reload()


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=fresh_env(**env), capture_output=True, text=True,
                          timeout=120)


def test_broken_plugin_is_listed_with_its_error() -> None:
    run = subprocess.run([str(BIN / "infiniops"), "providers"], env=fresh_env(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "failed to load" in next(line for line in lines if line.startswith("│ broken"))
    assert "loaded" in next(line for line in lines if line.startswith("│ example"))
    error = next(line for line in lines if line.startswith("broken failed to load:"))
    assert "ImportError: infiniops_broken: libexample_kernels.so not found" in error


def test_every_other_provider_still_resolves_and_runs() -> None:
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
    run = _python(code)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_allow_list_loads_only_the_named_plugins() -> None:
    code = "import infiniops_py as io; print(sorted(p.name for p in io.providers()))"
    run = _python(code, INFINIOPS_PROVIDERS="example,broken")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['broken', 'example', 'reference']"


def test_autoload_switch_leaves_only_the_reference_and_hand_registered() -> None:
    code = """
import infiniops_example, infiniops_py as io
print(sorted(p.name for p in io.providers()))
io.register_provider(infiniops_example, name="example")
print(sorted(p.name for p in io.providers()))
print(io.resolve("add", device_type="cpu", dtype="float16").provider)
"""
    run = _python(code, INFINIOPS_DISABLE_PLUGIN_AUTOLOAD="1")
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


def test_example_provider_passes_the_pytest_plugin_conformance(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--infiniops-provider", "example",
         "--infiniops-max-examples", "15"],
        cwd=tmp_path, env=fresh_env(), capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout  # add in float16 and float32, and its gate checks

