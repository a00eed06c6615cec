"""What the interpreter test modules share: the conformance run of an operator, seeded inputs, and a check
against the tolerance table."""

from __future__ import annotations

import torch

from infiniops_py.testing.compare import compare
from infiniops_py.testing.conformance import run_conformance
from infiniops_py.testing.tolerances import tolerance


def assert_conformant(op: str, examples: int) -> None:
    """The conformance suite passes for the Triton `op` on cpu, in fp16, bf16 and fp32, with cases run."""
    report = run_conformance("triton", device="cpu", ops=[op], max_examples=examples)
    assert report.ok, report.render()
    assert {r.dtype for r in report.ops} == {"float16", "bfloat16", "float32"}, report.render()
    assert all(r.examples - r.gated > 0 for r in report.ops), report.render()


def randn(*shape: int | tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32,
          scale: float = 1.0) -> torch.Tensor:
    """Standard normal values times `scale` in `dtype`, from a generator seeded with `seed`; `shape` as sizes
    or one tuple (empty: a 0-d tensor)."""
    gen = torch.Generator().manual_seed(seed)
    size = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return (torch.randn(size, generator=gen) * scale).to(dtype)


def check(op: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    """`got` is within `op`'s tolerance of the float64 reference `ref` (the dtype's row of the table)."""
    _, failure = compare(op, got, ref, tolerance(op, str(got.dtype).removeprefix("torch.")))
    assert failure is None, failure
