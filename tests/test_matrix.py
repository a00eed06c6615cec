"""The committed capability_matrix/ is what ``infiniops matrix --write`` produces (the artifact is fresh), and
its page filters in a real headless browser (Chromium)."""

from __future__ import annotations

import re
import shutil
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


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no chromium binary found: the matrix page's browser test needs one (Debian: apt-get install -y "
                "chromium; `make test` installs it as root)")


def _browse(browser: str, page: Path, query: str, profile: Path, *extra: str) -> str:
    """Chromium's DOM of `page` after its script ran, opened with `query` (the filters)."""
    run = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
         *extra, f"{page.as_uri()}{query}"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_matrix_page_filters_in_a_real_browser(generated: Path, tmp_path: Path) -> None:
    browser = _chromium()
    page = generated / "index.html"
    query = "?op=rms_norm&provider=torch&device=cuda&dtype=float16"
    dom = _browse(browser, page, query, tmp_path / "profile", "--dump-dom")
    shown = re.findall(r'<tr id="([^"]+)" data-op="[^"]*" data-provider="[^"]*">', dom)
    hidden = re.findall(r'<tr id="([^"]+)" data-op="[^"]*" data-provider="[^"]*" hidden="">', dom)
    assert shown == ["rms_norm.torch"] and len(hidden) > 10
    cells = re.findall(r'<td id="(rms_norm\.torch\.[^"]+)" class="(\w+)"[^>]*?( hidden="")?>', dom)
    assert [(cell, kind) for cell, kind, off in cells if not off] == [("rms_norm.torch.cuda.float16", "served")]
    assert re.search(r'<output id="count">1 of \d+ rows</output>', dom)
    searched = _browse(browser, page, "?q=needs%20triton", tmp_path / "profile", "--dump-dom")
    found = re.findall(r'<tr id="([^"]+)" data-op="[^"]*" data-provider="[^"]*">', searched)
    assert found and all(row.endswith(".triton") for row in found), found
    assert f'<output id="count">{len(found)} of ' in searched
    # triton serves no float64: with "only rows served in the columns shown" none is left
    none = _browse(browser, page, "?q=needs%20triton&dtype=float64&served=1", tmp_path / "profile", "--dump-dom")
    assert re.search(r'<output id="count">0 of \d+ rows</output>', none)
    shot = tmp_path / "matrix.png"
    _browse(browser, page, query, tmp_path / "profile", "--window-size=1400,900", f"--screenshot={shot}")
    assert shot.stat().st_size > 10_000  # the artifact: tmp_path/matrix.png
