"""Why a provider cannot run on this machine at all, whatever the problem: what ``explain`` says in one line
and ``providers`` in its status column."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infiniops_py.errors import Rejection

__all__ = ["cannot_run"]


def cannot_run(rejections: Iterable[Rejection], device_type: str) -> str:
    """Why the implementation whose `rejections` (of a problem on `device_type`) these are cannot run on this
    machine at all, or '' when nothing of the machine stops it.

    Holds for every problem: a needed import that is missing (`capability.Requires`), and a CUDA device needed
    whatever the problem's device (`capability.CudaAvailable` with ``always``, which rejects a non-cuda
    problem). Without a CUDA device the reason is that alone (installing a package cannot help there), with the
    missing imports named; else each missing import with its fix (``cupy is not importable (fix: pip install
    ...)``).
    """
    found = list(rejections)
    imports = [r for r in found if r.constraint == "requires"]
    cuda = [r for r in found if r.constraint == "cuda"]
    if not imports and not (cuda and device_type != "cuda"):
        return ""
    if cuda:
        names = " and ".join(str(r.found) for r in imports)
        verb = "are" if len(imports) > 1 else "is"
        return "this machine has no CUDA device" + (f" (and {names} {verb} not importable)" if imports else "")
    return "; ".join(f"{r.found} is not importable" + (f" (fix: {r.fix})" if r.fix else "") for r in imports)
