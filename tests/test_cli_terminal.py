"""The ``infiniops`` and ``infinilm`` commands on an 80-column terminal (issue #28's CLI lines, #30 item 10):
output folded to the width and never cut, usage errors that name what is known, ``providers`` without rich
and as JSON, a provider that cannot run here as one line, progress on a terminal, plain help texts.

The assertions hold with and without CuPy importable and with or without a CUDA device: what a provider
cannot run for is read from the same facts the command prints (its JSON), never written out here."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fakes import correct_add, cpu_capability, registered

import infiniops_py as io
from infiniops_py import Capability, OneOf, Requires
from infiniops_py.cli import COMMANDS, main
from infiniops_py.cli import providers as providers_command
from infiniops_py.cli._console import fold, plain_table

ELLIPSIS = "\u2026"


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("COLUMNS", "80")
    yield
    io.reload()


def _squeezed(text: str) -> str:
    """`text` without its whitespace: folding may break a line anywhere, and loses no other character."""
    return "".join(text.split())


def _fits(out: str, width: int = 80) -> None:
    lines = out.splitlines()
    assert lines and max(len(line) for line in lines) <= width, max(lines, key=len)
    assert ELLIPSIS not in out


def _provider_facts(capsys: pytest.CaptureFixture[str]) -> list[dict]:
    assert main(["providers", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)["providers"]


def test_providers_json_has_every_provider_and_its_status(capsys: pytest.CaptureFixture[str]) -> None:
    facts = _provider_facts(capsys)
    assert [f["name"] for f in facts] == sorted((p.name for p in io.providers()),
                                                key=lambda n: (n == "reference", n))
    torch_row = next(f for f in facts if f["name"] == "torch")
    assert torch_row["loaded"] and torch_row["cannot_run"] == "" and torch_row["implementations"] > 0
    assert set(torch_row) == {"name", "version", "source", "implementations", "loaded", "cannot_run", "error"}


@pytest.mark.parametrize("rich", [True, False])
def test_providers_fold_to_80_columns_and_never_cut_a_reason(rich: bool, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # a provider that cannot run anywhere (a module no machine has), whatever this machine has installed
    missing = Capability(OneOf("device_type", ("cpu",)), Requires("infiniops_no_such_module", "no-such-wheel"))
    with registered(("needsmod", [("add", missing, 1, correct_add)])):
        facts = _provider_facts(capsys)
        if not rich:  # the cli extra not installed: a plain table
            monkeypatch.setattr(providers_command, "Table", None)
        assert main(["providers"]) == 0
    out = capsys.readouterr().out
    _fits(out)
    assert ("│" in out) is rich
    needs = next(f for f in facts if f["name"] == "needsmod")
    assert needs["cannot_run"] == "infiniops_no_such_module is not importable (fix: pip install no-such-wheel)"
    source, status = _column(out, 2, rich), _column(out, 4, rich)
    for f in facts:  # every reason whole (the cupy provider's among them, with or without CuPy)
        assert _squeezed(f["cannot_run"]) in status, f["name"]
        assert _squeezed(f["source"]) in source


def _column(table: str, index: int, rich: bool) -> str:
    """The text of column `index` of a printed table, its folded cells joined, without whitespace: rich's
    cells are between box lines, the plain table's under the dashes of its header."""
    lines = table.splitlines()
    if rich:
        return "".join(line.split("│")[index + 1] for line in lines if line.startswith("│")).replace(" ", "")
    dashes = next(n for n, line in enumerate(lines) if line.startswith("---"))
    spans, at = [], 0
    for run in lines[dashes].split("  "):
        spans.append((at, at + len(run)))
        at += len(run) + 2
    start, end = spans[index]
    return "".join(line[start:end] for line in lines[dashes + 1:]).replace(" ", "")


def test_providers_needs_no_rich_at_all(capsys: pytest.CaptureFixture[str]) -> None:
    """``infiniops providers`` in a process where rich cannot be imported (as without the cli extra)."""
    import subprocess

    from fakes import fresh_env

    code = ("import sys; sys.modules['rich'] = None\n"
            "from infiniops_py.cli import main\n"
            "sys.exit(main(['providers']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=fresh_env(COLUMNS="80"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].split() == ["provider", "version", "source", "implementations", "status"]
    assert "reference" in run.stdout and "torch" in run.stdout
    _fits(run.stdout)


def test_the_commands_that_need_rich_say_which_extra(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import infiniops_py.cli as cli

    monkeypatch.setattr(cli, "Console", None)
    for args in (["matrix", "--op", "add"], ["check", "torch", "--op", "add"]):
        assert main(args) == 2
        assert "pip install 'infiniops-py[cli]'" in capsys.readouterr().err
    assert main(["matrix", "--op", "add", "--format", "json"]) == 0  # a machine format needs no rich
    assert main(["explain", "add"]) == 0  # plain text
    capsys.readouterr()


def test_explain_folds_to_80_columns_and_keeps_every_reason(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", "flash_attn_varlen", "--device", "cuda", "--dtype", "float32", "--head-dim", "300"]
    code = main(args)
    out = capsys.readouterr().out
    _fits(out)
    ex = io.explain("flash_attn_varlen", device_type="cuda", dtype="float32", head_dim=300)
    assert code == (0 if ex.chosen is not None else 1)
    for c in ex.candidates:
        assert f"{c.provider} ({c.implementation}, priority {c.priority}" in out
        if "cannot run on this machine" not in next(line for line in out.splitlines() if c.implementation in line):
            for r in c.rejections:
                assert _squeezed(str(r)) in _squeezed(out)


def test_explain_says_a_provider_that_cannot_run_here_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    missing = Capability(OneOf("device_type", ("cpu",)), OneOf("dtype", ("float16",)),
                         Requires("infiniops_no_such_module", "no-such-wheel"))
    with registered(("needsmod", [("add", missing, 50, correct_add)])):
        assert main(["explain", "add"]) == 0
    block = _candidate(capsys.readouterr().out, "needsmod")
    assert block == ("  1. needsmod (needsmod.add.0, priority 50): cannot run on this machine:\n"
                     "     infiniops_no_such_module is not importable (fix: pip install no-such-wheel)")
    # not the dtype it rejects too: it cannot run here at all


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA device")
def test_explain_without_a_gpu_says_the_gpu_provider_cannot_run_with_no_install_hint(
        capsys: pytest.CaptureFixture[str]) -> None:
    if "cupy" not in {p.name for p in io.providers()}:
        pytest.skip("the cupy provider is not installed")
    assert main(["explain", "rms_norm"]) == 0
    block = _candidate(capsys.readouterr().out, "cupy")
    assert "cannot run on this machine: this machine has no CUDA device" in " ".join(block.split())
    assert "pip install" not in block and "\n       - " not in block  # one item: no reason per constraint


def _candidate(out: str, provider: str) -> str:
    """The lines of `provider`'s entry in a ranking: its numbered line and the folded lines under it."""
    lines = out.splitlines()
    at = next(n for n, line in enumerate(lines) if line.lstrip()[:1].isdigit() and f". {provider} (" in line)
    end = next((n for n in range(at + 1, len(lines)) if not lines[n].startswith("     ")), len(lines))
    return "\n".join(lines[at:end])


def test_explain_conv_width_and_its_old_name(capsys: pytest.CaptureFixture[str]) -> None:
    main(["explain", "causal_conv1d", "--conv-width", "3"])
    new = capsys.readouterr().out
    main(["explain", "causal_conv1d", "--width", "3"])
    assert capsys.readouterr().out == new and "width=3" in new
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "causal_conv1d", "--conv-width", "0"])
    assert exit_.value.code == 2 and "--conv-width" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "flag", "value", "said"), [
    ("explain", "--dtype", "float99", "unknown dtype 'float99'; known: float16, bfloat16, float32, float64"),
    ("explain", "--device", "tpu", "unknown device 'tpu'; known: cpu, cuda (and cuda:N)"),
    ("matrix", "--device", "tpu", "unknown device 'tpu'; known: cpu, cuda (and cuda:N)"),
    ("tune", "--device", "tpu", "unknown device 'tpu'; known: cpu, cuda (and cuda:N)"),
    ("tune", "--dtype", "float99", "unknown dtype 'float99'; known: float16, bfloat16"),
    ("check", "--device", "tpu", "unknown device 'tpu'; known: cpu, cuda (and cuda:N)"),
    ("check", "--dtype", "float99", "unknown dtype 'float99'; known: float16, bfloat16"),
])
def test_an_unknown_dtype_or_device_is_a_usage_error_naming_the_known_ones(
        command: str, flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    target = {"explain": ["rms_norm"], "matrix": [], "tune": ["rms_norm"], "check": ["torch"]}[command]
    assert main([command, *target, flag, value]) == 2
    out = capsys.readouterr()
    assert out.err.startswith(f"infiniops {command}: {flag} {value}: ") and said in out.err, out.err
    assert out.out == ""  # nothing ran: no empty table


def test_explain_and_matrix_take_cuda_n_as_tune_does(capsys: pytest.CaptureFixture[str]) -> None:
    main(["explain", "rms_norm", "--device", "cuda:0"])
    out = capsys.readouterr().out
    assert out.startswith("rms_norm (device_type=cuda, ") and "cuda:0" not in out
    main(["explain", "rms_norm", "--device", "cuda"])
    assert capsys.readouterr().out == out
    assert main(["matrix", "--op", "add", "--device", "cuda:1", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == ["cuda"]


@pytest.mark.parametrize("value", ["0", "-5"])
def test_tune_refuses_a_size_field_below_1_naming_it(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    # issue #30 item 10: hidden_size=0 printed an empty table and exited 1 with no reason
    assert main(["tune", "rms_norm", "--field", f"hidden_size={value}"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert f"--field 'hidden_size={value}'" not in out.err  # the field, not the parse, is at fault
    assert f"rms_norm: field hidden_size={value} must be an int >= 1 (a size; its default is 4096)" in out.err


def test_check_table_fits_80_columns_with_whole_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "torch", "--op", "silu_and_mul", "--op", "fused_add_rms_norm", "--dtype", "float32",
                 "--max-examples", "2"]) == 0
    out = capsys.readouterr().out
    _fits(out)
    lines = out.splitlines()
    for name in ("silu_and_mul", "torch.silu_and_mul", "fused_add_rms_norm", "torch.fused_add_rms_norm"):
        assert any(f"│ {name} " in line for line in lines), name


def test_check_on_a_terminal_prints_a_line_per_row_and_nothing_on_a_pipe(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", "torch", "--op", "add", "--op", "rms_norm", "--dtype", "float32", "--max-examples", "2"]
    assert main(args) == 0
    assert capsys.readouterr().err == ""  # a pipe
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(args) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["checked add float32 (torch.add): 2 examples [1 rows done]",
                   "checked rms_norm float32 (torch.rms_norm): 2 examples [2 rows done]"]


def test_tune_on_a_terminal_prints_a_line_per_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from fakes import isolate_tuning, timed_gemm

    isolate_tuning(monkeypatch, tmp_path)
    with registered(("one", [("gemm", cpu_capability(), 40, timed_gemm())]),
                    ("two", [("gemm", cpu_capability(), 30, timed_gemm())])):
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
        assert main(["tune", "gemm", "--size", "m=2", "--size", "n=4", "--size", "k=4", "--force"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("timing gemm ") and err[0].endswith("(1/1)")


def test_help_texts_are_plain(capsys: pytest.CaptureFixture[str]) -> None:
    from infinilm.cli import main as lm_main

    for run, names in ((main, [c.name for c in COMMANDS]),
                       (lm_main, ["generate", "check", "bench", "demo", "bench-serve"])):
        for args in ([], *([n] for n in names)):
            with pytest.raises(SystemExit):
                run([*args, "--help"])
            out = capsys.readouterr().out
            assert "``" not in out and "`" not in out, args
            _fits(out)
    with pytest.raises(SystemExit) as exit_:
        lm_main(["--help"])
    out = capsys.readouterr().out
    for command in ("generate", "check", "bench", "demo", "serve", "bench-serve"):
        assert command in out
    with pytest.raises(SystemExit) as exit_:
        lm_main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"infinilm (infiniops-py {io.__version__})"


def test_fold_and_plain_table_keep_every_character() -> None:
    reason = "       - import=cupy is not importable (fix: pip install 'infiniops-provider-cupy[cuda13]' " + "x" * 100
    folded = fold(reason, 40)
    assert max(map(len, folded.splitlines())) <= 40 and _squeezed(folded) == _squeezed(reason)
    assert all(line.startswith("         ") for line in folded.splitlines()[1:])  # past the bullet
    table = plain_table(("a", "b"), [("x" * 90, "short"), ("y", "z " * 50)], 40)
    assert max(map(len, table.splitlines())) <= 40
    assert _column(table, 0, rich=False) == "x" * 90 + "y" and _column(table, 1, rich=False) == "short" + "z" * 50
