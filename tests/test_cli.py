"""The ``infiniops`` command, run in process through `main`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fakes import correct_add, cpu_capability, registered

import infiniops_py as io
from infiniops_py import Capability, Check, OneOf
from infiniops_py.cli import main
from infiniops_py.operators import OPERATORS
from infiniops_py.testing.conformance import allowed_share
from infiniops_py.testing.tolerances import EXACT, Allclose, LowPrecisionRule


@pytest.fixture(autouse=True)
def _clean_runtime() -> Iterator[None]:
    yield
    io.reload()


def test_providers_lists_each_with_version_and_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    for p in io.providers():
        assert p.name in out
    assert "built into infiniops-py" in out and "loaded" in out


def test_matrix_json_has_every_operator_and_served_cells(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [op["name"] for op in data["operators"]] == list(OPERATORS)
    add = next(op for op in data["operators"] if op["name"] == "add")
    reference = next(p for p in add["providers"] if p["provider"] == "reference")
    assert "float64" in data["dtypes"]  # the reference serves it
    assert len(reference["cells"]) == len(data["devices"]) * len(data["dtypes"])
    assert all(c["served"] for c in reference["cells"])
    scan = next(op for op in data["operators"] if op["name"] == "selective_scan")
    triton = next((p for p in scan["providers"] if p["provider"] == "triton"), None)
    if triton is not None:  # its own column, not only words among the limits
        assert triton["compute_capability"] == ["8.0"]


def test_matrix_cells_give_the_reason_they_are_gated(capsys: pytest.CaptureFixture[str]) -> None:
    with registered(("cpu32", [("add", cpu_capability(), 1, torch.add)])):
        assert main(["matrix", "--op", "add", "--device", "cpu", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("| cpu32 |")][-1]  # after the providers table
    assert row == ("| cpu32 | gated: dtype=float16 not in {float32} | gated: dtype=bfloat16 not in {float32} | served "
                   "| gated: dtype=float64 not in {float32} | - | cpu32.add.0: no other limits |")
    assert "| provider | cpu float16 | cpu bfloat16 | cpu float32 | cpu float64 | compute capability | limits |" in out


def test_matrix_table_and_html(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--op", "add", "--wide"]) == 0
    assert "served" in capsys.readouterr().out
    assert main(["matrix", "--op", "add", "--format", "html"]) == 0
    page = capsys.readouterr().out
    assert page.startswith("<!DOCTYPE html>") and '<tr id="add.reference"' in page
    assert '<td id="add.reference.cpu.float64" class="served"' in page  # a cell anchor per (device, dtype)
    assert "http://" not in page and "https://" not in page and "<link" not in page  # self-contained
    assert "--write capability_matrix" not in page  # it claims no directory it may not have been written to


@pytest.mark.parametrize("width", [80, 120])
def test_matrix_table_stays_within_the_terminal_width(width: int, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["matrix"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= width
    assert not any("\u2026" in line for line in lines)  # nothing cut with an ellipsis
    titles = {line.strip() for line in lines}
    for op in OPERATORS:
        assert op in titles, f"no table titled {op}"
    assert len(lines) < 3 * width  # compact: 288 lines at 120 columns before


def test_matrix_hides_providers_that_do_not_implement_an_operator(capsys: pytest.CaptureFixture[str]) -> None:
    def rows_of_mine(args: list[str]) -> int:
        assert main(["matrix", "--device", "cpu", *args]) == 0
        return sum(line.startswith("mine ") for line in capsys.readouterr().out.splitlines())

    with registered(("mine", [("add", cpu_capability(), 1, torch.add)])):
        assert rows_of_mine([]) == 1  # add only: no "no implementation" row for the other operators
        assert rows_of_mine(["--all-providers"]) == len(OPERATORS)


def test_matrix_machine_formats_write_only_what_was_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--op", "add", "--format", "json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["operators"][0]["name"] == "add" and not list(tmp_path.iterdir())
    assert main(["matrix", "--op", "add", "--format", "html", "--write", str(tmp_path / "one")]) == 0
    out = capsys.readouterr()
    assert out.out == "" and [p.name for p in (tmp_path / "one").iterdir()] == ["index.html"]
    assert out.err == f"wrote {tmp_path / 'one' / 'index.html'}\n"
    assert main(["matrix", "--op", "add", "--write", str(tmp_path / "all")]) == 0
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == ["MATRIX.md", "index.html", "matrix.json"]
    assert capsys.readouterr().out == ""
    assert main(["matrix", "--format", "table", "--write", str(tmp_path / "no")]) == 2
    assert "--write takes json, markdown or html" in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_matrix_rejects_an_unknown_operator(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--op", "nope"]) == 2
    assert "unknown operator 'nope'" in capsys.readouterr().err


def test_explain_names_every_candidate_and_its_failing_constraints(capsys: pytest.CaptureFixture[str]) -> None:
    # the acceptance example; with whatever providers are installed here
    op = "flash_attn_varlen" if "flash_attn_varlen" in OPERATORS else "add"
    args = ["explain", op, "--device", "cuda", "--dtype", "float32"]
    args += ["--head-dim", "300"] if op == "flash_attn_varlen" else []
    code = main(args)
    out = capsys.readouterr().out
    ex = io.explain(op, device_type="cuda", dtype="float32", **({"head_dim": 300} if op != "add" else {}))
    assert code == (0 if ex.chosen is not None else 1)
    for c in ex.candidates:
        assert f"{c.provider} ({c.implementation}, priority {c.priority})" in out
        for r in c.rejections:
            assert str(r) in out
    if not torch.cuda.is_available():
        assert code == 1
        assert "device=cuda is not present on this machine" in out
        assert "no provider can serve this problem" in out and "most likely fix:" in out


def test_explain_a_served_problem_with_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "add", "--device", "cpu", "--dtype", "bf16", "--field", "broadcast=true"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("add (device_type=cpu, dtype=bfloat16, broadcast=True, inplace=False)")
    assert "chosen" in out and "-> " in out


@pytest.mark.parametrize("args", [["explain", "nope"], ["explain", "add", "--head-dim", "64"],
                                  ["explain", "add", "--field", "broadcast"],
                                  ["explain", "add", "--field", "broadcast=maybe"]])
def test_explain_usage_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    assert capsys.readouterr().err.startswith("infiniops explain:")


def test_check_passes_a_conforming_provider(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "torch", "--op", "add", "--max-examples", "5"]) == 0
    out = capsys.readouterr().out
    assert "torch.add" in out and "gate checks" in out and out.rstrip().endswith("ok")


def test_check_fails_a_wrong_provider(capsys: pytest.CaptureFixture[str]) -> None:
    def wrong(input, other, alpha, out):  # type: ignore[no-untyped-def]
        return torch.sub(input, other, alpha=alpha, out=out)

    with registered(("wrong", [("add", cpu_capability(), 1, wrong)])):
        assert main(["check", "wrong", "--max-examples", "5"]) == 1
    out = capsys.readouterr().out
    assert "FAIL add float32 (wrong.add.0)" in out and out.rstrip().endswith("FAILED")
    assert main(["check", "not-installed"]) == 1


def test_check_of_a_provider_that_serves_nothing_here_fails_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    capability = Capability(OneOf("device_type", ("cuda",)), OneOf("dtype", ("float16",)))
    with registered(("gpuonly", [("add", capability, 1, correct_add)])):
        assert main(["check", "gpuonly"]) == 1
        assert main(["check", "gpuonly", "--device", "cpu", "--op", "rms_norm"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ["provider 'gpuonly' serves nothing to test on cpu: device_type=cpu not in {cuda}: try --device cuda",
                   "provider 'gpuonly' serves nothing to test on cpu: it implements no operator among those asked "
                   "(rms_norm)"]


def test_check_of_a_provider_that_gates_every_case_fails(capsys: pytest.CaptureFixture[str]) -> None:
    never = Check("broadcast", lambda problem: False, "serves no add at all")
    with registered(("never", [("add", cpu_capability(never), 1, correct_add)])):
        assert main(["check", "never", "--max-examples", "3"]) == 1
    out = capsys.readouterr().out
    assert "no case ran: the provider's capability gated every case drawn" in out and "FAILED" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_check_on_cuda_without_a_cuda_device_stops_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "torch", "--device", "cuda"]) == 1
    assert capsys.readouterr().out.strip() == "no CUDA device on this machine (torch.cuda.is_available() is False)"


def test_check_shows_the_worst_error_as_a_share_of_the_allowed_one(capsys: pytest.CaptureFixture[str]) -> None:
    def half_off(input, other, alpha, out):  # type: ignore[no-untyped-def]
        # float32 add allows 1e-4 + 1e-6 |ref|: an error of 5e-5 is about half of it
        return torch.add(input + 5e-5, other, alpha=alpha, out=out)

    with registered(("halfoff", [("add", cpu_capability(), 1, half_off)])):
        assert main(["check", "halfoff", "--max-examples", "8"]) == 0
    out = capsys.readouterr().out
    assert "err / allowed: the worst error" in out  # the column "err / allowed" (issue #28: 80 columns)
    row = next(line for line in out.splitlines() if "halfoff.add.0" in line)
    share = float(row.split("│")[-2])
    assert 0.4 < share < 0.55, row


def test_the_allowed_share_of_each_tolerance_rule() -> None:
    ref = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
    # Allclose: |err| / (atol + rtol |ref|), the worst element
    assert allowed_share(ref + torch.tensor([0.5, 0.0, 0.25]), ref, Allclose(0.5, 0.5)) == pytest.approx(0.5)
    assert allowed_share(ref + 6.4e-3, ref, Allclose(0.0, 0.0, atol_per_k=1e-4), k=128) == pytest.approx(0.5)
    # LowPrecisionRule: max |err| / (factor x the low-dtype reference's own max error + atol)
    low = ref + torch.tensor([0.0, 1e-2, 0.0])
    assert allowed_share(ref + 1e-2, ref, LowPrecisionRule(2.0, 0.0), low=low) == pytest.approx(0.5)
    assert allowed_share(ref + 1e-2, ref, EXACT) == 0.0 and allowed_share(ref, ref, Allclose(0.0, 1e-9)) == 0.0


def test_explain_with_a_block_size_means_a_paged_cache(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["explain", "flash_attn_with_kvcache", "--device", "cpu", "--dtype", "float32", "--head-dim", "64"]
    main([*base, "--block-size", "16"])
    assert "paged=True, block_size=16" in capsys.readouterr().out
    main([*base, "--block-size", "16", "--field", "paged=false"])  # an explicit field wins
    assert "paged=False, block_size=16" in capsys.readouterr().out


def test_a_reader_that_leaves_early_is_no_failure(tmp_path: Path) -> None:
    """``infiniops matrix | head``: stdout's reader has gone before anything is written (a pipe whose read end
    is closed), and the command still exits 0 with nothing on stderr."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run([sys.executable, "-m", "infiniops_py.cli", "matrix", "--device", "cpu"], stdout=write,
                             stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr
