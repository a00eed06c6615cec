"""The source of transformers' functions as `kernelize` compares it: `code_of`."""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

__all__ = ["code_of"]


@functools.cache
def code_of(fn: Any) -> str:
    """`fn`'s source (decorators included) without whitespace, comments or docstrings, so that a pattern matches
    however it is formatted; '' where there is no source (a builtin, a function made at run time)."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return ""
    code = re.sub(r"\s+", "", "".join(line.split("#")[0] for line in source.splitlines()))
    return re.sub(r'""".*?"""', "", code)
