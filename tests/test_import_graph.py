"""The import graph of `infinilm` and `infiniops_py` has no cycle.

Every module of both packages is parsed (never imported) and every import statement it holds counts as an
edge: module-level ones, deferred ones inside functions, and those under ``if TYPE_CHECKING:``, since a
cycle that only a deferred or type-checking import closes is still a cycle of the design. ``from a import b``
is an edge to ``a.b`` when that is a module, else to ``a``; relative imports are resolved against the
importing module. An import of ``a.b.c`` is an edge to ``a.b.c`` alone: that Python also runs the
``__init__`` of ``a`` and ``a.b`` first is not counted, or every package whose ``__init__`` re-exports its
submodules would be a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("infinilm", "infiniops_py")


def _modules() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of `PACKAGES` (a package is its ``__init__.py``)."""
    out = {}
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            parts = file.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def _imports(name: str, file: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that module `name` (in `file`) imports anywhere in its source."""
    package = name.split(".") if file.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], node.module or ""] if node.level
                            else [node.module or ""]).strip(".")
            for alias in node.names:
                target = f"{base}.{alias.name}"
                out.add(target if target in modules else base)
    return {m for m in out if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one module (each holds a cycle), sorted;
    Tarjan's algorithm, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None and nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt is not None:
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_the_graph_sees_deferred_and_type_checking_imports(tmp_path: Path) -> None:
    """The parser counts what the cycle test relies on: deferred, TYPE_CHECKING and relative imports."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import X\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    modules = {"pkg": pkg / "__init__.py", **{f"pkg.{m}": pkg / f"{m}.py" for m in "abc"}}
    graph = {name: _imports(name, file, modules) for name, file in modules.items()}
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert _cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert _cycles({**graph, "pkg.c": set()}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    """No module of `package` is on an import cycle (the graph holds the modules of both packages)."""
    modules = _modules()
    graph = {name: _imports(name, file, modules) for name, file in modules.items()}
    assert sum(m.startswith(f"{package}.") for m in graph) > 10
    cycles = [c for c in _cycles(graph) if any(m == package or m.startswith(f"{package}.") for m in c)]
    assert not cycles, "modules importing each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_only_the_operators_import_their_private_base() -> None:
    """The framework types live in public modules (problem, memory, errors): outside ``infiniops_py.operators``
    only the package's own ``__init__`` (for the index-check scopes) imports ``operators._base``, and the
    framework modules that the operators build on import no operator module."""
    modules = _modules()
    graph = {name: _imports(name, file, modules) for name, file in modules.items()}
    private = sorted(m for m, edges in graph.items() if "infiniops_py.operators._base" in edges
                     and not m.startswith("infiniops_py.operators") and m != "infiniops_py")
    assert not private, f"import infiniops_py.operators._base from outside the operators: {private}"
    for framework in ("infiniops_py.problem", "infiniops_py.memory", "infiniops_py.errors"):
        assert not {m for m in graph[framework] if m.startswith("infiniops_py.operators")}, framework


def test_the_ranks_of_a_split_model_import_nothing_of_the_engine() -> None:
    """``infinilm.distributed`` sits below ``infinilm.engine`` (the engine starts the ranks): what both need of a
    step, `infinilm.batch.Batch`, lives below both."""
    modules = _modules()
    graph = {name: _imports(name, file, modules) for name, file in modules.items()}
    upward = sorted((m, e) for m, edges in graph.items() if m.startswith("infinilm.distributed")
                    for e in edges if e == "infinilm.engine" or e.startswith("infinilm.engine."))
    assert not upward, f"infinilm.distributed imports the engine: {upward}"
    assert "infinilm.batch" in graph["infinilm.distributed.step"]
    assert "infinilm.batch" in graph["infinilm.engine.runner"]


# Import statements inside a function in infiniops_py/, each with its reason: (module, function, imported module).
# Imports by name (importlib) are not statements and not listed: the providers' modules (registry), the
# families' strategy modules (testing.strategies) and the tuning package's names of its tuner, loaded on first
# use (tuning/__init__'s __getattr__: the resolver imports the package's store and ranking, the tuner calls the
# operators).
DEFERRED: dict[tuple[str, str, str], str] = {
    **{("infiniops_py.capability", f, "torch"): "CUDA constraints ask torch only when one is evaluated"
       for f in ("_cuda_available", "_compute_capability")},
    **{key: "the CLI answers --help and usage errors without importing torch or the operators" for key in (
        ("infiniops_py.cli._command", "device", "infiniops_py.matrix"),
        ("infiniops_py.cli._command", "dtype", "infiniops_py.problem"),
        ("infiniops_py.cli._matrix_tables", "print_tables", "rich"),
        ("infiniops_py.cli.check", "_check_usage", "torch"),
        ("infiniops_py.cli.check", "_run", "infiniops_py.testing.conformance"),
        ("infiniops_py.cli.explain", "_run", "infiniops_py"),
        ("infiniops_py.cli.explain", "_run", "infiniops_py.operators"),
        ("infiniops_py.cli.matrix", "_run", "infiniops_py"),
        ("infiniops_py.cli.providers", "_run", "infiniops_py"),
        ("infiniops_py.cli.providers", "_cannot_run", "infiniops_py.capability"),
        ("infiniops_py.cli.providers", "_cannot_run", "infiniops_py.operators"),
        ("infiniops_py.cli.tune", "_run", "infiniops_py.errors"),
        ("infiniops_py.cli.tune", "_run", "torch"),
        ("infiniops_py.cli.tune", "_run", "infiniops_py"),
        ("infiniops_py.cli.tune", "_operator", "infiniops_py.operators"),
        ("infiniops_py.cli.tune", "_operator", "infiniops_py.tuning"),
        ("infiniops_py.cli.tune", "_model", "infiniops_py.errors"),
        ("infiniops_py.cli.tune", "_model", "infinilm"))},
    **{key: "transformers is an optional dependency (the integration's extra)" for key in (
        ("infiniops_py.integrations.transformers._attention", "register", "transformers"),
        ("infiniops_py.integrations.transformers._attention", "register", "transformers.masking_utils"),
        ("infiniops_py.integrations.transformers._plan", "_attention_unsupported", "transformers"),
        ("infiniops_py.integrations.transformers._plan", "_attention_unsupported", "transformers.masking_utils"),
        ("infiniops_py.integrations.transformers._plan", "_silu_class", "transformers.activations"))},
    **{key: "torch.distributed is missing from some torch builds" for key in (
        ("infiniops_py.operators.all_reduce", "_distributed", "torch.distributed"),
        ("infiniops_py.operators.all_reduce", "reference", "torch.distributed"),
        ("infiniops_py.testing.strategies.all_reduce", "one_rank_group", "torch.distributed"))},
    **{("infiniops_py.testing.pytest_plugin", f, "infiniops_py.testing.conformance"):
       "the plugin loads in every pytest session: the suite (hypothesis) only when a provider is tested"
       for f in ("runtest", "collect")},
    ("infiniops_py.tuning.store", "_cuda_driver", "ctypes"): "the CUDA driver is asked only on a CUDA machine",
    ("infiniops_py.tuning.store", "_triton_version", "importlib.metadata"): "triton's version only when installed",
    ("infiniops_py.tuning.store", "_locked", "fcntl"): "fcntl is POSIX-only",
}


def _deferred() -> set[tuple[str, str, str]]:
    """(module, function, imported module) for each import statement inside a function of infiniops_py/."""
    found = set()
    for name, file in _modules().items():
        if not name.startswith("infiniops_py"):
            continue
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import):
                        found.update((name, node.name, alias.name) for alias in inner.names)
                    elif isinstance(inner, ast.ImportFrom):
                        found.add((name, node.name, inner.module or ""))
    return found


def test_no_import_inside_a_function_but_those_listed_with_their_reason() -> None:
    """An import inside a function hides an edge of the import graph (often one that would close a cycle): in
    infiniops_py/ only those of `DEFERRED` are made, each for the reason it gives."""
    found, listed = _deferred(), set(DEFERRED)
    assert not found - listed, f"imports inside functions, not listed with a reason: {sorted(found - listed)}"
    assert not listed - found, f"listed but gone (drop them from DEFERRED): {sorted(listed - found)}"
