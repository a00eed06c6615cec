"""Packaging: every distribution is typed and versioned, depends on what it imports (the core on what its
runtime imports, extras for the CLI and the test harness), providers name the core releases they were built
for, ``make`` installs CuPy only with a CUDA device; the built wheels say their license (Apache-2.0, the
LICENSE file in each), authors, classifiers and README, the Triton provider takes a range of Triton, and the
wheels of the core and the torch provider alone (no rich) run ``infiniops providers`` in a fresh venv with
nothing on stderr."""

from __future__ import annotations

import ast
import email.message
import email.parser
import json
import subprocess
import sys
import zipfile
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


SOURCES = {"infiniops-py": ROOT, **{f"infiniops-provider-{n}": ROOT / "providers" / n for n in PROVIDERS}}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The four distributions built as wheels (``pip wheel --no-deps``) into a temporary folder, by name."""
    out = tmp_path_factory.mktemp("wheels")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(out), *map(str, SOURCES.values())], capture_output=True, text=True, timeout=300,
                           env=fresh_env(PYTHONWARNINGS="ignore:Editable installation"))
    assert build.returncode == 0, build.stderr
    found = {w.name.split("-")[0].replace("_", "-"): w for w in out.glob("*.whl")}
    assert sorted(found) == sorted(SOURCES)
    return found


def _metadata(wheel: Path) -> tuple[email.message.Message, dict[str, bytes]]:
    """The wheel's METADATA, and the files of its ``.dist-info`` folder by path inside it."""
    with zipfile.ZipFile(wheel) as z:
        info = {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if n.split("/")[0].endswith(".dist-info")}
    return email.parser.BytesParser().parsebytes(info["METADATA"]), info


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SOURCES))
def test_every_wheel_says_its_license_authors_classifiers_and_readme(name: str, wheels: dict[str, Path]) -> None:
    meta, info = _metadata(wheels[name])
    assert meta["Name"] == name and meta["Version"] == infiniops_py.__version__
    assert meta["License-Expression"] == "Apache-2.0" and meta.get_all("License-File") == ["LICENSE"]
    assert info["licenses/LICENSE"] == (ROOT / "LICENSE").read_bytes()  # the one text, in every distribution
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License\n")
    assert meta["Author"] == meta["Maintainer"] == "InfiniOps-Py developers"
    classifiers = meta.get_all("Classifier")
    assert {"Programming Language :: Python :: 3", "Typing :: Typed", "Development Status :: 3 - Alpha"} <= set(
        classifiers)
    assert not any(c.startswith("License ::") for c in classifiers)  # the license expression says it
    assert any(c.startswith("Environment :: GPU :: NVIDIA CUDA") for c in classifiers)
    for url in meta.get_all("Project-URL") or []:  # none yet: the project has no public home to name
        assert url.split(", ", 1)[1].startswith("https://"), url
    assert meta["Description-Content-Type"] == "text/markdown"
    readme = (SOURCES[name] / "README.md").read_text()
    assert meta.get_payload().strip() == readme.strip()
    if name != "infiniops-py":  # a provider's README says what it serves and how to install it
        assert "pip install infiniops-py" in readme and name in readme


@pytest.mark.slow
def test_the_triton_wheel_takes_the_triton_of_a_cuda_torch_wheel(wheels: dict[str, Path]) -> None:
    meta, _ = _metadata(wheels["infiniops-provider-triton"])
    triton = next(Requirement(r) for r in meta.get_all("Requires-Dist") if r.startswith("triton"))
    # tested: 3.6.0 (torch 2.11's CUDA wheels; this venv, the H200), 3.7.1 (torch 2.12's and 2.13's, under the
    # interpreter); not a pin, which pip cannot install beside a CUDA torch that pins another Triton
    assert triton.specifier.contains("3.6.0") and triton.specifier.contains("3.7.1")
    assert not triton.specifier.contains("3.5.1") and not triton.specifier.contains("3.8.0")
    assert str(triton.specifier) != "==3.6.0"


@pytest.mark.slow
def test_wheels_in_a_fresh_venv_run_infiniops_providers_without_rich(wheels: dict[str, Path], tmp_path: Path) -> None:
    # about 40 s: torch comes from pip's configured sources (a local wheel on the project's machines)
    venv = tmp_path / "venv"
    # no PYTHONPATH: a source tree on it (with the egg-info the wheel build left) reads as installed to pip
    clean = {k: v for k, v in fresh_env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env = {**clean, "PYTHONWARNINGS": "ignore:Editable installation"}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    bin_dir = venv / "bin"
    install = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheels["infiniops-py"]),
                              str(wheels["infiniops-provider-torch"]), f"torch=={torch.__version__.partition('+')[0]}"],
                             capture_output=True, text=True, timeout=300, env=env)
    assert install.returncode == 0, install.stderr[-3000:]

    def infiniops(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bin_dir / "infiniops"), *args], capture_output=True, text=True, timeout=120,
                              env={**clean, "COLUMNS": "80"}, cwd=tmp_path)

    assert subprocess.run([str(bin_dir / "python"), "-c", "import rich"], capture_output=True, timeout=60,
                          env=clean).returncode != 0  # the core and the torch provider only: no cli extra
    run = infiniops("providers")
    assert run.returncode == 0 and run.stderr == "", run.stderr  # no NumPy warning, nothing else
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["provider", "version", "source", "implementations", "status"]  # the plain table
    assert max(map(len, lines)) <= 80
    rows = {line.split()[0]: line for line in lines[2:] if line[:1] != " "}
    assert set(rows) == {"meta", "torch", "reference"} and rows["torch"].endswith("loaded")
    # the cupy wheel too, without CuPy: the provider loads and says why it cannot run here, whole
    install = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps",
                              str(wheels["infiniops-provider-cupy"])], capture_output=True, text=True, timeout=120,
                             env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    run = infiniops("providers", "--format", "json")
    assert run.returncode == 0 and run.stderr == "", run.stderr
    cupy = next(p for p in json.loads(run.stdout)["providers"] if p["name"] == "cupy")
    assert cupy["loaded"] and not cupy["error"] and "cupy is not importable" in cupy["cannot_run"]
    assert not (venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" / "cupy").exists()
    version = infiniops("--version")
    assert version.stdout.strip() == f"infiniops-py {infiniops_py.__version__}"
