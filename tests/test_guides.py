"""The README's "Add an operator" and "Write a provider" sections, run as written.

Each Python block of the two sections starts with a comment naming its file. The test copies the core
(``infiniops_py``) into a temporary folder, writes the operator's module into it and puts the registry line at
the end of ``FAMILIES`` (nothing else of the core changes), lays the provider out as an installed distribution
with its entry point (`tests/example_plugins.py`), and runs in a fresh interpreter: ``infiniops check`` on the
new operator and the provider, ``torch.compile(fullgraph=True)`` and ``torch.export`` of a call, and the matrix
row, and the tuner on a call its declaration's ``sample_inputs`` builds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.example_plugins import Plugin, write_distribution

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = r'''
import json, torch
import infiniops_py as ops
from infiniops_py.matrix import build
from infiniops_py.operators.scale_rows import scale_rows

x = torch.randn(5, 8)
with ops.use("mine", op="scale_rows"):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda t: scale_rows(t, 2.0) + 1)(x)
    compiled = torch.compile(lambda t: scale_rows(t, 2.0) + 1, fullgraph=True)(x)

class Scale(torch.nn.Module):
    def forward(self, t):
        return scale_rows(t, 3.0)

exported = torch.export.export(Scale(), (x,))
targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
with ops.use("mine", op="scale_rows"):
    ran = exported.module()(x)
matrix = build(devices=("cpu",), dtypes=("float32",))
from infiniops_py.tuning import tune_problem
tuned = tune_problem("scale_rows", sizes={"tokens": 33}, fields={"hidden_size": 8}, save=False).results
print(json.dumps({
    "breaks": explained.graph_break_count,
    "compiled": torch.allclose(compiled, x * 2 + 1),
    "exported": torch.allclose(ran, x * 3),
    "targets": targets,
    "schema": str(torch.ops.infiniops.scale_rows.default._schema),
    "tuned": [[repr(r.problem), r.status] for r in tuned],
    "rows": [[r.provider, [c.text() for c in r.cells]] for r in matrix.rows_of("scale_rows")],
}))
'''


def _blocks(section: str) -> dict[str, str]:
    """The Python blocks of README section `section`, by the path their first line names."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {section}\n")
    body = text[start + 1:text.index("\n## ", start + 1)]
    out = {}
    for block in re.findall(r"```python\n(.*?)```", body, re.S):
        first, _, rest = block.partition("\n")
        out[first.removeprefix("# ").split(":")[0]] = rest
    return out


def test_the_readme_adds_an_operator_and_a_provider_that_pass_check_compile_export_and_the_matrix(
        tmp_path: Path) -> None:
    operator = _blocks("Add an operator")
    provider = _blocks("Write a provider")
    core = tmp_path / "core"
    shutil.copytree(ROOT / "infiniops_py", core / "infiniops_py", ignore=shutil.ignore_patterns("__pycache__"))
    (core / "infiniops_py/operators/scale_rows.py").write_text(operator["infiniops_py/operators/scale_rows.py"])
    registry = core / "infiniops_py/operators/__init__.py"
    source = registry.read_text()
    families = source.index("FAMILIES: Final")
    close = source.index("\n)\n", families)
    registry.write_text(source[:close + 1] + operator["infiniops_py/operators/__init__.py"] + source[close + 1:])
    package = tmp_path / "src/infiniops_mine"
    package.mkdir(parents=True)
    for path, code in provider.items():
        (package / Path(path).name).write_text(code)
    site = tmp_path / "site"
    write_distribution(site, Plugin("infiniops-provider-mine", package, {"mine": "infiniops_mine"}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(core), str(site), str(ROOT / "providers/torch")]),
           "INFINIOPS_PROVIDERS": "mine,torch"}
    command = [sys.executable, "-m", "infiniops_py.cli", "check", "mine", "--op", "scale_rows", "--op", "add",
               "--max-examples", "15"]
    check = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "mine.scale_rows" in check.stdout and "mine.add" in check.stdout, check.stdout
    run = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["breaks"] == 0 and found["compiled"] and found["exported"], found
    assert "infiniops.scale_rows.default" in found["targets"], found["targets"]
    assert found["schema"] == "infiniops::scale_rows(Tensor x, float scale) -> Tensor"
    assert [p for p, _ in found["tuned"]] == ["Problem(scale_rows, device_type=cpu, dtype=float32, hidden_size=8; "
                                             "size bucket tokens<=64)"], found["tuned"]  # built by sample_inputs
    assert ["mine", ["served"]] in found["rows"] and ["reference", ["served"]] in found["rows"], found["rows"]
