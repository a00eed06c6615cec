"""The matrix's files: `FILES` names the file of each format, `write` writes them into a folder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from infiniops_py.matrix._build import Matrix
from infiniops_py.matrix._html import to_html
from infiniops_py.matrix._text import to_json, to_markdown

__all__ = ["FILES", "write"]

FILES: Final = {"json": "matrix.json", "markdown": "MATRIX.md", "html": "index.html"}
_RENDER: Final = {"json": to_json, "markdown": to_markdown, "html": to_html}


def write(m: Matrix, directory: str | Path, formats: Sequence[str] = tuple(FILES)) -> list[Path]:
    """Write the `formats` (default all: ``matrix.json``, ``MATRIX.md``, ``index.html``, named by `FILES`)
    into `directory`, created if needed; returns the paths written.

    Raises:
        KeyError: an unknown format. OSError: the directory or a file cannot be written.
    """
    for fmt in formats:
        if fmt not in FILES:
            raise KeyError(f"unknown matrix format {fmt!r}; known: {', '.join(FILES)}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = root / FILES[fmt]
        path.write_text(_RENDER[fmt](m), encoding="utf-8")
        written.append(path)
    return written
