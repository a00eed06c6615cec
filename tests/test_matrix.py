"""The committed capability_matrix/ is what ``infiniops matrix --write`` produces (the artifact is fresh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fakes import fresh_env

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "capability_matrix"
FILES = ("matrix.json", "MATRIX.md", "index.html")
REGENERATE = "make matrix  (or: INFINIOPS_PROVIDERS=torch,triton,cupy infiniops matrix --write capability_matrix)"


def _generate(directory: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "infiniops_py.cli", "matrix", "--write", str(directory)],
        env=fresh_env(INFINIOPS_PROVIDERS="torch,triton,cupy"), capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("matrix")
    _generate(directory)
    return directory


def test_committed_matrix_is_fresh(generated: Path) -> None:
    missing = [name for name in FILES if not (COMMITTED / name).is_file()]
    assert not missing, f"capability_matrix/ lacks {missing}; regenerate it with: {REGENERATE}"
    for name in FILES:
        fresh = (generated / name).read_text(encoding="utf-8")
        committed = (COMMITTED / name).read_text(encoding="utf-8")
        assert committed == fresh, f"capability_matrix/{name} is stale; regenerate it with: {REGENERATE}"


def test_matrix_files_are_deterministic_and_machine_independent(generated: Path, tmp_path: Path) -> None:
    _generate(tmp_path)
    for name in FILES:
        text = (generated / name).read_text(encoding="utf-8")
        assert text == (tmp_path / name).read_text(encoding="utf-8")
        assert str(ROOT) not in text and str(tmp_path) not in text  # no paths of this machine
