"""Linear layers through `infiniops_py.gemm` (``nn.Linear`` weight layout ``[N, K]``, ``trans_b=True``).

Bias: fused into the Gemm when the gate plan says a provider serves ``has_bias=True``, else Gemm then an
in-place broadcast `infiniops_py.add`. A packed layer (QKV, gate+up) keeps one weight and maps each
checkpoint tensor to a row range of it (`shards`).
"""

from __future__ import annotations

import torch

from infiniops_py import add, gemm

__all__ = ["Linear"]


class Linear:
    """``y = x @ weight.T + bias`` for x ``[T, K]``, weight ``[N, K]``, bias ``[N]``; y ``[T, N]`` in x's dtype.

    Attributes:
        shards: checkpoint sub-name (``q_proj``) -> ``(start, stop)`` rows of `weight` (and `bias`);
            ``{"": (0, N)}`` for an unpacked layer.
    """

    __slots__ = ("bias", "fuse_bias", "shards", "weight")

    def __init__(
        self, in_features: int, out_features: int | dict[str, int], *, bias: bool, fuse_bias: bool,
        dtype: torch.dtype, device: torch.device,
    ) -> None:
        parts = out_features if isinstance(out_features, dict) else {"": out_features}
        self.shards: dict[str, tuple[int, int]] = {}
        start = 0
        for name, n in parts.items():
            self.shards[name] = (start, start + n)
            start += n
        self.weight = torch.empty(start, in_features, dtype=dtype, device=device)
        self.bias = torch.empty(start, dtype=dtype, device=device) if bias else None
        self.fuse_bias = fuse_bias

    def targets(self, prefix: str) -> dict[str, torch.Tensor]:
        """Checkpoint tensor name -> the view of this layer's storage it loads into."""
        out: dict[str, torch.Tensor] = {}
        for name, (lo, hi) in self.shards.items():
            stem = f"{prefix}.{name}" if name else prefix
            out[f"{stem}.weight"] = self.weight[lo:hi]
            if self.bias is not None:
                out[f"{stem}.bias"] = self.bias[lo:hi]
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None or self.fuse_bias:
            return gemm(x, self.weight, bias=self.bias, trans_b=True)
        y = gemm(x, self.weight, trans_b=True)
        return add(y, self.bias, out=y)
