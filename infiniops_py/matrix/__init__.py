"""The capability matrix: operators x providers x devices x dtypes, as data, JSON, Markdown and HTML.

A cell is *served* when some implementation of the provider declares the device and the dtype (its other
limits, such as head dims or widths, are listed beside it), else *gated* with the reasons. Only static
constraints are evaluated: environment constraints (a needed import, a CUDA device, a compute capability)
are shown as requirements, so the output is the same on any machine with the same providers installed;
the minimum compute capability also has a column of its own. Rows are (operator, provider) pairs for the
providers that implement the operator (``unimplemented=True`` adds the others). Everything is sorted and
carries no timestamp; `write` produces ``matrix.json``, ``MATRIX.md`` and ``index.html`` (a single
self-contained page: filters by operator, provider, device and dtype, search, sortable columns, an anchor
per row and per cell, a legend; no network).
"""

from infiniops_py.matrix._build import DEVICES, DTYPES, Cell, Matrix, ProviderInfo, Row, build
from infiniops_py.matrix._files import FILES, write
from infiniops_py.matrix._html import to_html
from infiniops_py.matrix._text import to_json, to_markdown

__all__ = ["DEVICES", "DTYPES", "FILES", "Cell", "Matrix", "ProviderInfo", "Row", "build", "to_html", "to_json",
           "to_markdown", "write"]
