"""Packaging: every distribution is typed and versioned, depends on what it imports (the core on what its
runtime imports, extras for the CLI and the test harness), providers name the core releases they were built
for, ``make`` installs CuPy only with a CUDA device, and wheels of the core and the torch provider run
``infiniops providers`` in a fresh venv with nothing on stderr."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib  # Python 3.11+
import torch
from fakes import fresh_env
from packaging.requirements import Requirement

import infinilm
import infiniops_py

ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = ("torch", "triton", "cupy")
# import name -> distribution, for the third-party imports of this repository
DISTRIBUTIONS = {"torch": "torch", "pluggy": "pluggy", "numpy": "numpy", "rich": "rich", "hypothesis": "hypothesis",
                 "pytest": "pytest", "transformers": "transformers", "safetensors": "safetensors",
                 "tokenizers": "tokenizers", "tqdm": "tqdm", "aiohttp": "aiohttp",
                 "prometheus_client": "prometheus-client", "triton": "triton", "cupy": "cupy-cuda13x"}


def _project(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name for r in requirements}


def _imports(files: list[Path]) -> set[str]:
    """The top-level third-party modules `files` import (anywhere in them, lazily or not)."""
    found: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name.partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.partition(".")[0])
    return {m for m in found if m in DISTRIBUTIONS}


def test_every_distribution_is_typed_versioned_and_built_for_a_core_range() -> None:
    core = _project(ROOT)["project"]
    assert core["version"] == infiniops_py.__version__ == infinilm.__version__
    for package in ("infiniops_py", "infinilm"):
        assert (ROOT / package / "py.typed").is_file()
        assert _project(ROOT)["tool"]["setuptools"]["package-data"][package] == ["py.typed"]
    for name in PROVIDERS:
        data = _project(ROOT / "providers" / name)
        package = f"infiniops_{name}"
        assert data["project"]["version"], name
        assert (ROOT / "providers" / name / package / "py.typed").is_file()
        assert data["tool"]["setuptools"]["package-data"][package] == ["py.typed"]
        core_req = next(Requirement(r) for r in data["project"]["dependencies"] if r.startswith("infiniops-py"))
        assert core_req.specifier, f"{name} depends on an unversioned infiniops-py"
        assert core_req.specifier.contains(infiniops_py.__version__)
        assert not core_req.specifier.contains("1.0.0"), f"{name}: no upper bound on the core"
    cupy = _project(ROOT / "providers" / "cupy")["project"]
    assert not any(r.startswith("cupy") for r in cupy["dependencies"])  # a CPU machine needs none
    assert {k: _names(v) for k, v in cupy["optional-dependencies"].items()} == {
        "cuda12": {"cupy-cuda12x"}, "cuda13": {"cupy-cuda13x"}}


def test_core_dependencies_are_what_the_runtime_imports() -> None:
    project = _project(ROOT)["project"]
    extras = {k: _names(v) for k, v in project["optional-dependencies"].items()}
    core = _names(project["dependencies"])
    package = ROOT / "infiniops_py"
    runtime = [p for p in package.rglob("*.py")
               if not {"testing", "integrations", "cli"} & set(p.relative_to(package).parts)]
    assert {DISTRIBUTIONS[m] for m in _imports(runtime)} == core - {"numpy"}  # numpy: torch warns without it
    assert {DISTRIBUTIONS[m] for m in _imports(list((package / "cli").rglob("*.py")))} <= core | extras["cli"]
    assert {DISTRIBUTIONS[m] for m in _imports(list((package / "testing").rglob("*.py")))} <= core | extras["test"]
    assert "rich" not in core and "hypothesis" not in core
    llm = list((ROOT / "infinilm").rglob("*.py")) + list((package / "integrations").rglob("*.py"))
    serve = [p for p in llm if "serve" in p.parts]
    assert {DISTRIBUTIONS[m] for m in _imports([p for p in llm if p not in serve])} <= core | extras["llm"]
    assert {DISTRIBUTIONS[m] for m in _imports(serve)} <= core | extras["llm"] | extras["serve"]


def test_make_installs_cupy_only_with_a_cuda_device() -> None:
    def install_line(*variables: str) -> str:
        run = subprocess.run(["make", "-n", "-B", "install", *variables], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr
        return next(line for line in run.stdout.splitlines() if "providers/cupy" in line)

    assert '"providers/cupy"' in install_line("CUDA_MAJOR=")
    assert '"providers/cupy[cuda12]"' in install_line("CUDA_MAJOR=12")
    assert '"providers/cupy[cuda13]"' in install_line("CUDA_MAJOR=13")
    assert 'PYTHONWARNINGS="ignore:Editable installation"' in install_line("CUDA_MAJOR=")


@pytest.mark.slow
def test_wheels_in_a_fresh_venv_run_infiniops_providers_without_a_warning(tmp_path: Path) -> None:
    # about 40 s: torch comes from pip's configured sources (a local wheel on the project's machines)
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    env = fresh_env(PYTHONWARNINGS="ignore:Editable installation")
    sources = [str(ROOT), str(ROOT / "providers" / "torch"), str(ROOT / "providers" / "cupy")]
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(wheels), *sources], capture_output=True, text=True, timeout=120, env=env)
    assert build.returncode == 0, build.stderr
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    bin_dir = venv / "bin"
    found = sorted(str(w) for w in wheels.glob("*.whl"))
    core = next(w for w in found if "infiniops_py-" in w)
    install = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", f"{core}[cli]",
                              *(w for w in found if w != core), f"torch=={torch.__version__.partition('+')[0]}"],
                             capture_output=True, text=True, timeout=300, env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    clean = {k: v for k, v in fresh_env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = subprocess.run([str(bin_dir / "infiniops"), "providers"], capture_output=True, text=True, timeout=120,
                         env={**clean, "COLUMNS": "200"}, cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == "", run.stderr  # no NumPy warning, nothing else
    assert "torch" in run.stdout and "reference" in run.stdout
    cupy = next(line for line in run.stdout.splitlines() if line.startswith(("│ cupy ", "| cupy ")))
    assert "cannot run: cupy is not importable" in cupy and "failed" not in cupy  # not installed, not broken
    assert not (venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" / "cupy").exists()
    version = subprocess.run([str(bin_dir / "infiniops"), "--version"], capture_output=True, text=True, timeout=60,
                             env=clean, cwd=tmp_path)
    assert version.stdout.strip() == f"infiniops-py {infiniops_py.__version__}"

