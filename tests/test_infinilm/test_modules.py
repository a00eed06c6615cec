"""The modules of infinilm hold no state: every name a module binds at its top level is a constant.

A module-level list, dict, set, counter or mutable object is state shared by every engine of the process
(request ids numbered across engines, a table one caller could change under another); constants are
numbers, strings, tuples, frozensets, read-only mappings, dtypes, compiled regular expressions, frozen
dataclasses, and the module's functions (memoized pure ones too, partial applications of them to constants,
`operator.attrgetter` / `itemgetter`, a `contextlib.nullcontext` of None), classes and imports. A `logging.Logger` is
allowed: the logging module's registry, not the module, holds it (``logging.getLogger(name)`` is the same object
for every caller).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import importlib
import logging
import operator
import pkgutil
import re
import struct
import types
import typing

import torch

import infinilm

_CONSTANT_TYPES = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range,
                   types.MappingProxyType, types.GenericAlias, torch.dtype, enum.Enum, re.Pattern, logging.Logger,
                   functools._lru_cache_wrapper, struct.Struct)


def _is_constant(value: object) -> bool:
    if isinstance(value, _CONSTANT_TYPES):
        return True
    if isinstance(value, types.ModuleType | type | types.FunctionType | types.BuiltinFunctionType):
        return True
    if isinstance(value, operator.attrgetter | operator.itemgetter):  # immutable: no attribute to rebind
        return True
    if isinstance(value, functools.partial):  # its function and arguments are read-only; constants each
        return (not vars(value) and _is_constant(value.func) and all(map(_is_constant, value.args))
                and all(map(_is_constant, value.keywords.values())))
    if isinstance(value, contextlib.nullcontext):  # enters to None, exits doing nothing: shared without state
        return vars(value) == {"enter_result": None}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.__dataclass_params__.frozen  # type: ignore[attr-defined]
    # typing constructs (aliases such as ``tuple[str, dict[str, Any]]``, TypeVars) and ``from __future__`` flags
    return type(value).__module__ in ("typing", "types", "__future__") or isinstance(value, typing.TypeVar)


def test_no_module_binds_mutable_state() -> None:
    names = [m.name for m in pkgutil.walk_packages(infinilm.__path__, "infinilm.")]
    assert "infinilm.engine.sequence" in names and "infinilm.models.registry" in names
    state = [f"{name}.{key}: {type(value).__name__}" for name in names
             for key, value in vars(importlib.import_module(name)).items()
             if not key.startswith("__") and not _is_constant(value)]
    assert not state, "module-level state:\n" + "\n".join(state)
