"""The conformance suite of several providers on one GPU, as parallel ``infiniops check`` jobs (the GPU acceptance run).

    python3 benchmarks/gpu_check.py triton:300 cupy:300 torch:50 --logs gpu-check [--jobs 8] [--budget 540]
        [--device cuda] [--op OP ...] [--dtype T ...] [--max-examples N] [--shards K] [--seed S]

A provider argument is ``NAME`` or ``NAME:EXAMPLES`` (default ``--max-examples``, 300). There is one job per
(provider, operator, dtype) the provider declares on the device:

    python -m infiniops_py.cli check NAME --device D --op OP --dtype T --max-examples N --json LOGS/NAME-OP-T.json \
        --progress

with its output in ``LOGS/NAME-OP-T.log`` (a line per example: a killed job still shows how far it got and
which cases were slow); below `SPLIT_EXAMPLES` examples one job per (provider, operator)
runs all its dtypes (``NAME-OP-all``), since a job's start (imports, CUDA context) then outweighs its work.
``--jobs`` of them run at a time on the one GPU (their float64 references run there too: ``infiniops
check``'s default on cuda), the heaviest operators first, each with an equal share of the CPU threads.
When ``--budget`` seconds have passed, the running jobs are killed and reported as ``killed (budget)``
with the number of examples they had run, the ones not started as ``not run (budget)``.

``--shards K`` splits each job of the heaviest operators (attention, the scan) into K jobs of ceil(N/K)
examples each, with seeds S, S+1, ... (``--seed``; default: a fresh random S, printed), so they run side by side;
the table then has a row per shard and a ``total`` row per (provider, operator, dtype).

Printed last: the failures, then one table of every job's rows: provider, operator, dtype, examples run,
gated, failed, worst |err| (and as a share of the tolerance), seconds, status, and ``grid``: which values
of the GPU acceptance grid (`GRID`: head dims 64/128/256, GQA ratios 1/4/8, block sizes 16/256, 8192-token sequences)
the row ran, where it has them.

Exit status: 0 when every job passed; 1 on any failure, crash, or job killed or not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

# the GPU acceptance grid: the values each operator's rows should have run (not gated), and the
# longest sequence (max_seqlen_k) they should have reached
_ATTENTION_GRID: Final = {"head_dim": (64, 128, 256), "gqa_ratio": (1, 4, 8), "block_size": (16, 256)}
GRID: Final[dict[str, dict[str, tuple[int, ...]]]] = {
    "flash_attn_varlen": _ATTENTION_GRID,
    "flash_attn_with_kvcache": _ATTENTION_GRID,
    "reshape_and_cache_flash": {"head_dim": (64, 128, 256), "block_size": (16, 256)},
}
LONGEST: Final = {"flash_attn_varlen": 8192, "flash_attn_with_kvcache": 8192}
# rough cost of an operator's job on the GPU, to start the heaviest first
_WEIGHT: Final = {"flash_attn_varlen": 6, "flash_attn_with_kvcache": 5, "selective_scan": 5, "causal_conv1d": 3,
                  "gemm": 3, "causal_conv1d_update": 2, "selective_state_update": 2,
                  "top_k_top_p_sampling_from_logits": 3}
_KEPT_FAILURES: Final = 3
SPLIT_EXAMPLES: Final = 100
SHARDED_WEIGHT: Final = 5  # operators at least this heavy are split by --shards


@dataclass
class Job:
    """One ``infiniops check`` subprocess: a provider's operator in one dtype."""

    provider: str
    op: str
    dtype: str | None  # None: every dtype the provider declares for `op`
    examples: int
    logs: Path
    status: str = "not run (budget)"
    seconds: float = 0.0
    report: dict[str, Any] | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    started: float = 0.0
    shard: str = ""  # "i/K" when the row's examples are split over K jobs
    seed: int | None = None
    ran: int = 0  # examples a killed job had run (from its progress lines)

    @property
    def name(self) -> str:
        part = f"-s{self.shard.split('/')[0]}" if self.shard else ""
        return f"{self.provider}-{self.op}-{self.dtype or 'all'}{part}"

    def command(self, device: str) -> list[str]:
        dtype = ["--dtype", self.dtype] if self.dtype else []
        seed = ["--seed", str(self.seed)] if self.seed is not None else []
        return [sys.executable, "-m", "infiniops_py.cli", "check", self.provider, "--device", device, "--op",
                self.op, *dtype, "--max-examples", str(self.examples), *seed, "--progress",
                "--json", str(self.logs / f"{self.name}.json")]

    def start(self, device: str, env: dict[str, str]) -> None:
        log = (self.logs / f"{self.name}.log").open("wb")
        self.started = time.monotonic()
        # a session of its own: the budget kills the job's whole process group, and nothing else
        self.process = subprocess.Popen(self.command(device), stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        log.close()

    def finish(self, returncode: int) -> None:
        self.seconds = time.monotonic() - self.started
        path = self.logs / f"{self.name}.json"
        self.report = json.loads(path.read_text()) if path.exists() else None
        if self.report is None:
            self.status = f"crashed (exit {returncode})"
        else:
            self.status = "ok" if self.report["ok"] and returncode == 0 else "FAILED"

    def kill(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):  # it may have ended on its own meanwhile
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.seconds = time.monotonic() - self.started
        self.ran = _examples_logged(self.logs / f"{self.name}.log")
        self.status = f"killed (budget) after {self.ran}"


def _examples_logged(log: Path) -> int:
    """How many examples a job had run, passing or not: its ``--progress`` lines (``OP DTYPE #N ...``),
    over all the dtypes it ran."""
    count = 0
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            words = line.split()
            count += len(words) > 2 and words[2].startswith("#") and words[2][1:].isdigit()
    return count


def plan(providers: list[tuple[str, int]], device: str, ops: list[str] | None, dtypes: list[str] | None,
         logs: Path, shards: int = 1, seed: int = 0) -> tuple[list[Job], list[str]]:
    """The jobs, heaviest first, and an error line per provider that cannot run; with `shards` > 1 the
    heaviest operators' jobs are split (seeds `seed`, `seed` + 1, ...)."""
    from infiniops_py.testing.conformance import declared_pairs

    jobs, errors = [], []
    for name, examples in providers:
        pairs, error = declared_pairs(name, device)
        if error:
            errors.append(error)
        pairs = [(op, dtype) for op, dtype in pairs
                 if (ops is None or op in ops) and (dtypes is None or dtype in dtypes)]
        if examples >= SPLIT_EXAMPLES or dtypes is not None:
            jobs += [Job(name, op, dtype, examples, logs) for op, dtype in pairs]
        else:
            jobs += [Job(name, op, None, examples, logs) for op in sorted({op for op, _ in pairs})]
    if shards > 1:
        jobs = [part for j in jobs for part in _split(j, shards, seed)]
    order = {name: i for i, (name, _) in enumerate(providers)}
    jobs.sort(key=lambda j: (order[j.provider], -_WEIGHT.get(j.op, 1), j.op, j.dtype or ""))
    return jobs, errors


def _split(job: Job, shards: int, seed: int) -> list[Job]:
    if _WEIGHT.get(job.op, 1) < SHARDED_WEIGHT or job.examples < shards:
        return [job]
    each = -(-job.examples // shards)
    return [Job(job.provider, job.op, job.dtype, each, job.logs, shard=f"{i + 1}/{shards}", seed=seed + i)
            for i in range(shards)]


def run(jobs: list[Job], device: str, parallel: int, budget: float | None) -> None:
    """Run `jobs`, `parallel` at a time, until done or `budget` seconds have passed."""
    threads = max(1, (os.cpu_count() or 1) // parallel)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    deadline = None if budget is None else time.monotonic() + budget
    waiting, running = list(jobs), []
    while waiting or running:
        while waiting and len(running) < parallel and (deadline is None or time.monotonic() < deadline):
            job = waiting.pop(0)
            job.start(device, env)
            print(f"started {job.name}", flush=True)
            running.append(job)
        for job in list(running):
            assert job.process is not None
            code = job.process.poll()
            if code is not None:
                job.finish(code)
                running.remove(job)
                print(f"{job.status:<8} {job.name} ({job.seconds:.0f} s)", flush=True)
        if deadline is not None and time.monotonic() >= deadline:
            for job in running:
                assert job.process is not None
                code = job.process.poll()  # one that ended since the last poll keeps its report
                if code is not None:
                    job.finish(code)
                    print(f"{job.status:<8} {job.name} ({job.seconds:.0f} s)", flush=True)
                    continue
                job.kill()
                print(f"killed {job.name} at the budget ({job.seconds:.0f} s)", flush=True)
            return  # jobs still waiting keep their "not run (budget)" status
        time.sleep(0.2)


def grid(op: str, coverage: dict[str, list[Any]]) -> str:
    """Whether a row of `op` ran the acceptance grid (`GRID`): ``ok``, ``-`` (no grid for `op`), else what it missed."""
    if op not in GRID:
        return "-"
    missing = []
    for name, values in GRID[op].items():
        absent = [str(v) for v in values if v not in coverage.get(name, ())]
        if absent:
            missing.append(f"{name} {','.join(absent)}")
    longest = max(coverage.get("max_seqlen_k", [0]))
    if op in LONGEST and longest < LONGEST[op]:
        missing.append(f"max_seqlen_k {longest}<{LONGEST[op]}")
    return "missing " + "; ".join(missing) if missing else "ok"


def rows(jobs: list[Job]) -> list[list[str]]:
    """One summary row per report row (a job may hold several implementations), or one for a job without;
    after the shards of a row, their ``total`` (examples summed, worst errors maxed, grid over all)."""
    out: list[list[str]] = []
    totals: dict[tuple[str, str, str], dict[str, Any]] = {}
    unfinished: set[tuple[str, str, str | None]] = set()  # shards that left no report
    for j in jobs:
        ops = j.report["ops"] if j.report is not None else []
        shard = f" [{j.shard}]" if j.shard else ""
        for r in ops:
            status = j.status if not r["failed"] else "FAILED"
            share = r.get("worst_allowed")
            out.append([j.provider, r["op"], r["dtype"] + shard, str(r["examples"]), str(r["gated"]),
                        str(r["failed"]), f"{r['worst']:.3g}", "-" if share is None else f"{share:.2f}",
                        f"{r['seconds']:.0f}", status, grid(r["op"], r["coverage"])])
            if j.shard:
                _add_total(totals.setdefault((j.provider, r["op"], r["dtype"]), {}), r, status)
        if not ops:
            out.append([j.provider, j.op, (j.dtype or "all") + shard, str(j.ran) if j.ran else "-", "-", "-",
                        "-", "-", f"{j.seconds:.0f}", j.status, "-"])
            if j.shard:
                unfinished.add((j.provider, j.op, j.dtype))  # dtype None: each dtype the job would have run
    for (provider, op, dtype), t in totals.items():
        missing = (provider, op, dtype) in unfinished or (provider, op, None) in unfinished
        complete = not missing and t.get("status") == "ok"
        out.append([provider, op, f"{dtype} total", str(t.get("examples", 0)), str(t.get("gated", 0)),
                    str(t.get("failed", 0)), f"{t.get('worst', 0.0):.3g}", f"{t.get('share', 0.0):.2f}", "-",
                    "ok" if complete else "INCOMPLETE" if t.get("status") == "ok" else "FAILED",
                    grid(op, t.get("coverage", {}))])
    return out


def _add_total(total: dict[str, Any], r: dict[str, Any], status: str) -> None:
    for key in ("examples", "gated", "failed"):
        total[key] = total.get(key, 0) + r[key]
    total["worst"] = max(total.get("worst", 0.0), r["worst"])
    total["share"] = max(total.get("share", 0.0), r.get("worst_allowed") or 0.0)
    coverage = total.setdefault("coverage", {})
    for name, values in r["coverage"].items():
        coverage[name] = sorted({*coverage.get(name, []), *values})
    if status != "ok":
        total["status"] = status
    total.setdefault("status", "ok")


def summary(jobs: list[Job], errors: list[str]) -> str:
    """The failures, then the table."""
    lines = [f"ERROR {e}" for e in errors]
    for j in jobs:
        report = j.report or {}
        for r in report.get("ops", []):
            lines += [f"FAIL {j.name}: [{f['note']}] {f['message']}" for f in r["failures"][:_KEPT_FAILURES]]
        if report.get("error"):
            lines.append(f"FAIL {j.name}: {report['error']}")
        gates = report.get("gates") or {}
        lines += [f"FAIL {j.name} gate: {g['message']}" for g in gates.get("failures", [])[:_KEPT_FAILURES]]
        if j.report is None and j.status != "not run (budget)":
            lines.append(f"FAIL {j.name}: {j.status}; see {j.logs / (j.name + '.log')}")
    header = ["provider", "operator", "dtype", "run", "gated", "failed", "worst |err|", "of allowed", "s", "status",
              "grid"]
    table = [header, *rows(jobs)]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    return "\n".join(lines)


def _provider(text: str, default: int) -> tuple[str, int]:
    name, _, examples = text.partition(":")
    return name, int(examples) if examples else default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("providers", nargs="+", metavar="NAME[:EXAMPLES]")
    parser.add_argument("--logs", required=True, type=Path, help="directory for each job's log and JSON report")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--jobs", type=int, default=8, help="jobs at a time (default: 8)")
    parser.add_argument("--budget", type=float, default=None, help="seconds before stragglers are killed")
    parser.add_argument("--max-examples", type=int, default=300, help="examples per row without :EXAMPLES")
    parser.add_argument("--op", action="append", help="an operator (repeatable; default: all)")
    parser.add_argument("--dtype", action="append", help="a dtype (repeatable; default: all declared)")
    parser.add_argument("--shards", type=int, default=1, help="split the heaviest operators' jobs in K (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="first shard's seed (default: random)")
    opts = parser.parse_args(argv)
    opts.logs.mkdir(parents=True, exist_ok=True)
    providers = [_provider(p, opts.max_examples) for p in opts.providers]
    names = [name for name, _ in providers]
    if len(set(names)) < len(names):
        parser.error(f"a provider is named twice ({', '.join(names)}): its jobs would share their logs")
    start = time.monotonic()
    seed = opts.seed if opts.seed is not None else random.randrange(2**31)
    jobs, errors = plan(providers, opts.device, opts.op, opts.dtype, opts.logs, max(1, opts.shards), seed)
    if any(j.shard for j in jobs):
        print(f"shards of the heaviest operators: seeds {seed}..{seed + opts.shards - 1}", flush=True)
    run(jobs, opts.device, max(1, opts.jobs), opts.budget)
    text = summary(jobs, errors)
    (opts.logs / "summary.txt").write_text(text + "\n")
    print(f"\n{len(jobs)} jobs in {time.monotonic() - start:.0f} s; logs in {opts.logs}\n{text}")
    return 0 if not errors and jobs and all(j.status == "ok" for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
