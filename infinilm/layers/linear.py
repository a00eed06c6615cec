"""Linear layers through `infiniops_py.gemm` (``nn.Linear`` weight layout ``[N, K]``, ``trans_b=True``).

Bias: fused into the Gemm when the gate plan says a provider serves ``has_bias=True``, else Gemm then an
in-place broadcast `infiniops_py.add`. A packed layer (QKV, gate+up) keeps one weight and maps each
checkpoint tensor to a row range of it (`shards`).

Tensor parallelism (Megatron-LM's layers, as vLLM names them): a `ColumnParallelLinear` holds one row range of
each checkpoint tensor it packs (its output features; the bias rows likewise), and its output is this rank's
part, never communicated; a `RowParallelLinear` holds a column range (its input features), multiplies the
rank's part of the input, sums the partial products of every rank with one `infiniops_py.all_reduce`, and
then adds the whole bias once (every rank holds it). Each rank loads only its ranges (`Shard` targets).
"""

from __future__ import annotations

import torch

from infinilm.distributed.parallel import Shard
from infiniops_py import add, all_reduce, gemm

__all__ = ["ColumnParallelLinear", "Linear", "RowParallelLinear", "Rows"]

Rows = tuple[int, int, int]  # (start, stop, full): rows [start, stop) of a checkpoint dimension of `full` rows


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

    def packed_target(self) -> torch.Tensor | Shard:
        """What one checkpoint tensor packing every part, in order (GLM-4's ``gate_up_proj.weight``), loads into."""
        return self.weight

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


class ColumnParallelLinear(Linear):
    """`Linear` over this rank's rows of each packed part: part `name` is rows ``[start, stop)`` of the checkpoint
    tensor ``<prefix>.<name>.weight`` ``[full, K]`` (and of its bias); y ``[T, sum of stop - start]``.

    Attributes:
        sources: part name -> its `Rows` in the checkpoint.
    """

    __slots__ = ("sources",)

    def __init__(
        self, in_features: int, parts: dict[str, Rows], *, bias: bool, fuse_bias: bool, dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__(in_features, {name: stop - start for name, (start, stop, _) in parts.items()}, bias=bias,
                         fuse_bias=fuse_bias, dtype=dtype, device=device)
        self.sources = dict(parts)

    def packed_target(self) -> Shard:
        """This rank's rows of one checkpoint tensor packing every part in order: each part's rows, offset by the
        full sizes of the parts before it."""
        ranges, offset = [], 0
        for start, stop, full in self.sources.values():
            ranges.append((offset + start, offset + stop))
            offset += full
        return Shard(self.weight, (offset, self.weight.shape[1]), 0, tuple(ranges))

    def targets(self, prefix: str) -> dict[str, torch.Tensor | Shard]:
        """Checkpoint tensor name -> the `Shard` (this rank's rows) each part loads."""
        out: dict[str, torch.Tensor | Shard] = {}
        for name, (lo, hi) in self.shards.items():
            start, stop, full = self.sources[name]
            stem = f"{prefix}.{name}" if name else prefix
            out[f"{stem}.weight"] = Shard(self.weight[lo:hi], (full, self.weight.shape[1]), 0, ((start, stop),))
            if self.bias is not None:
                out[f"{stem}.bias"] = Shard(self.bias[lo:hi], (full,), 0, ((start, stop),))
        return out


class RowParallelLinear:
    """``y = all_reduce(x @ weight.T) + bias`` for this rank's part x ``[T, stop - start]`` of the input features
    and columns ``[start, stop)`` of the checkpoint weight ``[N, full]``; y ``[T, N]``, the same on every rank.

    The partial products are summed in x's dtype (one `infiniops_py.all_reduce`); the bias ``[N]``, whole on
    every rank, is added once after the sum (a broadcast in-place `infiniops_py.add`).
    """

    __slots__ = ("bias", "cols", "weight")

    def __init__(self, cols: Rows, out_features: int, *, bias: bool, dtype: torch.dtype, device: torch.device) -> None:
        start, stop, _ = self.cols = cols
        self.weight = torch.empty(out_features, stop - start, dtype=dtype, device=device)
        self.bias = torch.empty(out_features, dtype=dtype, device=device) if bias else None

    def targets(self, prefix: str) -> dict[str, torch.Tensor | Shard]:
        """Checkpoint tensor name -> the weight's `Shard` (this rank's columns) and the whole bias."""
        start, stop, full = self.cols
        out: dict[str, torch.Tensor | Shard] = {
            f"{prefix}.weight": Shard(self.weight, (self.weight.shape[0], full), 1, ((start, stop),))}
        if self.bias is not None:
            out[f"{prefix}.bias"] = self.bias
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(gemm(x, self.weight, trans_b=True))
        return y if self.bias is None else add(y, self.bias, out=y)
