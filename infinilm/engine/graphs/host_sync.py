"""Which operator implementation synchronizes with the host: the reason a CUDA-graph capture failed.

A CUDA graph cannot capture a call that waits for the device (``.item()``, ``int(t)``, ``.tolist()``,
``nonzero``, a blocking copy to the host). When one is captured, the capture fails with an error that no
longer says which call did it (``operation failed due to a previous error during capture``), as the
torch provider's paged attention does on CUDA (it reads the longest cache length on the host). So after a
failed capture the graph code runs the step once more, eagerly, with the index checks off (as they are
during capture) and CUDA's sync debug mode at ``error`` (`syncs_raise`): the first synchronizing call raises
at its own line, and `first_host_sync` names the operator, the implementation the gate plan chose for it,
and the source line.

The probe explains a failure; it never prevents a capture: an implementation may synchronize only when
it is not being captured (``torch.cuda.is_current_stream_capturing()``), which an eager run cannot tell.
"""

from __future__ import annotations

import contextlib
import linecache
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from infiniops_py import Implementation, unchecked_indices

__all__ = ["capture_failed_status", "first_host_sync", "syncs_raise"]

_TORCH_DIR = str(Path(torch.__file__).parent)


@contextlib.contextmanager
def syncs_raise(device: torch.device) -> Iterator[None]:
    """Make every CUDA call that synchronizes with the host raise ``RuntimeError`` (no-op off CUDA)."""
    if device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def first_host_sync(forward: Callable[[], object], device: torch.device,
                    implementations: Iterable[Implementation] = ()) -> str | None:
    """Run `forward` (an already warmed-up step) under `syncs_raise`; None when nothing synchronized.

    Otherwise a one-line description of the first synchronizing call: ``"<op>: <implementation>
    synchronizes with the host at <package>/<file>:<line> `<source>`"``, the implementation found among
    `implementations` (the gate plan's choices) by its function's code in the traceback. Errors other than
    a synchronization propagate.
    """
    try:
        with unchecked_indices(), syncs_raise(device):
            forward()
    except RuntimeError as exc:
        if "synchroniz" not in str(exc):
            raise
        return _describe(exc, list(implementations))
    return None


def capture_failed_status(exc: BaseException, forward: Callable[[], object], device: torch.device,
                          implementations: Iterable[Implementation] = ()) -> str:
    """The status line after a capture failed with `exc`: the synchronizing implementation when the
    `forward` step finds one (see `first_host_sync`), else the capture's own error."""
    try:
        culprit = first_host_sync(forward, device, implementations)
    except Exception:  # the probe failed too (the device may be unusable): report the capture's own error
        culprit = None
    if culprit:
        return f"cuda graphs: off ({culprit}; a CUDA graph cannot capture a host sync)"
    return f"cuda graphs: off (capture failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})"


def _describe(exc: BaseException, implementations: list[Implementation]) -> str:
    by_code = {impl.fn.__code__: impl for impl in implementations if hasattr(impl.fn, "__code__")}
    impl: Implementation | None = None
    where = ""
    tb = exc.__traceback__
    while tb is not None:  # outermost to innermost: the last match is the innermost
        code = tb.tb_frame.f_code
        impl = by_code.get(code, impl)
        if not code.co_filename.startswith(_TORCH_DIR):
            path = Path(code.co_filename)
            source = linecache.getline(code.co_filename, tb.tb_lineno).strip()
            where = f"{path.parent.name}/{path.name}:{tb.tb_lineno} `{source}`"
        tb = tb.tb_next
    who = f"{impl.op}: {impl.name}" if impl is not None else "a call outside the operators"
    return f"{who} synchronizes with the host at {where}" if where else f"{who} synchronizes with the host"
