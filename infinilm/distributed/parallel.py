"""How a model splits across tensor-parallel ranks: the layout arithmetic, the split check, the gate problems.

Megatron-LM's layout, as vLLM runs it: with ``size`` ranks, rank ``r`` holds

- attention: query heads ``[r * Hq / size, (r + 1) * Hq / size)``; KV heads split the same way when there are
  at least ``size`` of them, else replicated: rank ``r`` holds KV head ``r // (size / Hkv)``, the one its query
  heads read (query head ``h`` reads KV head ``h // (Hq / Hkv)``), so each rank's attention is plain GQA over
  its own heads, its KV cache holds only those heads;
- the MLP: the rows ``[r * I / size, (r + 1) * I / size)`` of the gate and up projections (column parallel),
  the same columns of the down projection (row parallel: one all-reduce);
- the vocabulary: ``ceil(V / size)`` rows of the embedding and of the LM head each (the last rank's padded
  with zero rows);
- Mamba-2: heads ``[r * H / size, (r + 1) * H / size)`` with their channels of the gate, x, dt, the conv, D,
  A and the norm weight, and their SSM and conv states; the B/C groups split like the KV heads (split when
  there are at least ``size`` groups, else the one group its heads use, replicated).

`check_split` refuses a configuration that does not split so (before any process starts or any weight is
read); `parallel_problems` adds the `infiniops_py.all_reduce` problems a split model calls to the gates.
`Shard` is what a rank loads of one checkpoint tensor.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from infinilm.config import ConfigError, EngineOptions, Mamba2Dims, ModelConfig

__all__ = ["Shard", "TensorParallel", "backend_for", "check_split", "parallel_problems"]


def backend_for(device_type: str) -> str:
    """The ``torch.distributed`` backend of the model's collectives on `device_type`: nccl on cuda, else gloo."""
    return "nccl" if device_type == "cuda" else "gloo"


@dataclass(frozen=True)
class Shard:
    """What one rank loads of a checkpoint tensor: along `dim`, the index ranges `ranges` of the tensor (of full
    shape `shape`, what its header must declare), concatenated in order, fill `view`.

    Raises:
        ValueError: the ranges do not fit `shape` or do not fill `view` (a layout bug, found at build time).
    """

    view: torch.Tensor
    shape: tuple[int, ...]
    dim: int
    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        full = self.shape[self.dim]
        rows = sum(hi - lo for lo, hi in self.ranges)
        expected = (*self.shape[:self.dim], rows, *self.shape[self.dim + 1:])
        if any(not 0 <= lo <= hi <= full for lo, hi in self.ranges) or tuple(self.view.shape) != expected:
            raise ValueError(f"Shard: ranges {self.ranges} of dim {self.dim} of shape {list(self.shape)} do not fill "
                             f"a view of shape {list(self.view.shape)}")


@dataclass(frozen=True)
class TensorParallel:
    """This process's place among `size` tensor-parallel ranks (the model's collectives run over
    ``torch.distributed``'s default process group), and the part of each dimension that `rank` holds.

    The methods assume a configuration `check_split` accepts.
    """

    size: int
    rank: int = 0

    def split(self, n: int) -> tuple[int, int]:
        """This rank's ``[start, stop)`` of `n` rows split evenly (`n` divisible by `size`)."""
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per

    def shared(self, n: int) -> tuple[int, int]:
        """This rank's ``[start, stop)`` of `n` heads (KV heads, B/C groups): split when ``n >= size``, else the one
        of them its query (SSM) heads use, ``rank // (size / n)``, replicated on ``size / n`` ranks."""
        if n >= self.size:
            return self.split(n)
        index = self.rank // (self.size // n)
        return index, index + 1

    def vocab(self, vocab_size: int) -> tuple[int, int, int]:
        """``(start, stop, rows)``: this rank holds token ids ``[start, stop)`` in a table of ``rows =
        ceil(V / size)`` rows (the rows past ``stop - start`` are padding)."""
        rows = math.ceil(vocab_size / self.size)
        start = min(vocab_size, self.rank * rows)
        return start, min(vocab_size, start + rows), rows

    def ssm_dims(self, s: Mamba2Dims) -> Mamba2Dims:
        """This rank's Mamba-2 numbers: its heads, its (or its one replicated) group, their channels."""
        lo, hi = self.shared(s.n_groups)
        heads = s.num_heads // self.size
        return dataclasses.replace(s, num_heads=heads, n_groups=hi - lo, intermediate_size=heads * s.head_dim)

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """`config` with this rank's heads and intermediate size (its type and other fields kept): the sizes of
        its weights, attention and cache."""
        if config.ssm is not None:
            s = self.ssm_dims(config.ssm)
            return dataclasses.replace(config, num_heads=s.num_heads, num_kv_heads=s.num_heads,
                                       intermediate_size=s.intermediate_size, ssm=s)
        lo, hi = self.shared(config.num_kv_heads)
        return dataclasses.replace(config, num_heads=config.num_heads // self.size, num_kv_heads=hi - lo,
                                   intermediate_size=config.intermediate_size // self.size)


_LISTED_SIZES = 128  # the largest tensor_parallel_size a split error lists among the sizes that work


def _split_problems(config: ModelConfig, size: int) -> list[str]:
    """What keeps `config` from splitting across `size` ranks, one line each (empty: it splits)."""
    def divides(name: str, n: int, *, shared: bool = False) -> list[str]:
        if n % size == 0 or (shared and size % n == 0):
            return []
        need = f"a multiple of {size}" + (" or a divisor of it (then replicated)" if shared else "")
        return [f"{name}={n} is not {need}"]

    if config.ssm is not None:
        s = config.ssm
        return divides("num_heads", s.num_heads) + divides("n_groups", s.n_groups, shared=True)
    return (divides("num_attention_heads", config.num_heads)
            + divides("num_key_value_heads", config.num_kv_heads, shared=True)
            + divides("intermediate_size", config.intermediate_size))


def check_split(config: ModelConfig, options: EngineOptions) -> None:
    """Refuse ``options.tensor_parallel_size`` ranks that `config` cannot be split across, or that this machine
    cannot run; nothing is checked for 1 rank. Runs before any process starts and before any weight is read.

    Raises:
        ConfigError: a head count, KV-head or group count, or intermediate size that does not divide (every one
            named, with the sizes up to 128 that would); torch without torch.distributed or without the backend of the
            device (nccl on cuda, gloo on cpu); fewer CUDA devices than ranks.
    """
    size = options.tensor_parallel_size
    if size == 1:
        return
    what = f"tensor_parallel_size={size}"
    problems = _split_problems(config, size)
    if problems:
        heads = config.ssm.num_heads if config.ssm is not None else config.num_heads
        listed = min(heads, _LISTED_SIZES)  # a working size divides the heads; 1 always works
        sizes = [n for n in range(1, listed + 1) if not _split_problems(config, n)]
        unlisted = f"; those above {listed} are not listed" if heads > listed else ""
        raise ConfigError(f"{what} cannot split this {config.model_type} model across {size} ranks: "
                          f"{'; '.join(problems)} (fix: a tensor_parallel_size in {sizes}{unlisted})")
    device = torch.device(options.device)
    backend = backend_for(device.type)
    import torch.distributed as dist

    if not dist.is_available() or not getattr(dist, f"is_{backend}_available")():
        raise ConfigError(f"{what} on {device.type} needs torch.distributed's {backend} backend, which this torch "
                          f"build lacks (torch.distributed.is_{backend}_available() is False)")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        first = device.index or 0
        if first + size > count:
            raise ConfigError(f"{what} on {options.device} needs CUDA devices cuda:{first} .. cuda:{first + size - 1} "
                              f"(one per rank); this machine has {count}")


def parallel_problems(config: ModelConfig, options: EngineOptions,
                      base: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The ``(operator, problem fields)`` a model split across ``options.tensor_parallel_size`` ranks adds to its
    gate: the `infiniops_py.all_reduce` of its row-parallel layers, embedding and logits in the model dtype;
    for Mamba-2 whose norm groups span ranks, that of the float32 squared sums of the gated norm; and the
    broadcast `infiniops_py.add` of a row-parallel bias (added after the all-reduce, never fused into the Gemm
    of a partial sum). None for 1 rank.

    `base` holds ``device_type`` and the model ``dtype`` name.
    """
    size = options.tensor_parallel_size
    if size == 1:
        return []
    fields = {"backend": backend_for(base["device_type"]), "world_size": size}
    out = [("all_reduce", {**base, **fields})]
    if config.ssm is not None and config.ssm.n_groups < size and base["dtype"] != "float32":
        out.append(("all_reduce", {**base, "dtype": "float32", **fields}))
    if config.o_bias or config.mlp_bias or (config.ssm is not None and config.ssm.use_bias):
        out.append(("add", {**base, "broadcast": True, "inplace": True}))
    return out
