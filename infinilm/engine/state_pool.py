"""The recurrent state pool of a Mamba-2 model: one row of conv and SSM states per running request.

A recurrent model keeps no KV blocks: each running request owns one **row** of two pools preallocated per
layer, a conv state ``[conv_dim, W-1]`` in the model dtype and an SSM state ``[H, P, N]`` in float32, whatever
the request's length. Rows come from a `BlockAllocator` whose one block spans a whole sequence
(``block_size = max_model_len``), so the unchanged scheduler admits a request only while a row is free and
queues it otherwise, never preempts (a running request never needs a second row), and frees the row on EOS,
max tokens and cancellation for the next request to reuse. A prefill never reads its row, it overwrites it
with the prompt's final states, so a reused row cannot leak the previous holder's state.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from infinilm.config import EngineOptions, ModelConfig
from infinilm.engine.kv_cache import BlockAllocator
from infinilm.engine.memory import cache_units, check_cache_fits
from infinilm.engine.sequence import Sequence

__all__ = ["StatePool", "describe_state", "state_bytes"]


def state_bytes(config: ModelConfig, dtype: torch.dtype) -> tuple[int, int]:
    """Bytes of one request's ``(conv state, SSM state)`` over all layers; independent of its length.

    Raises:
        ConfigError: `config` is not a recurrent (Mamba-2) config.
    """
    s = config.ssm_dims()
    conv = config.num_layers * s.conv_dim * (s.conv_kernel - 1) * torch.empty((), dtype=dtype).element_size()
    return conv, config.num_layers * s.num_heads * s.head_dim * s.state_size * 4


def describe_state(config: ModelConfig, dtype: torch.dtype) -> str:
    """One line for ``infinilm check``: the recurrent shape and the state bytes per request.

    Raises:
        ConfigError: `config` is not a recurrent (Mamba-2) config.
    """
    s = config.ssm_dims()
    conv, ssm = state_bytes(config, dtype)
    return (f"{config.model_type}, {config.num_layers} layers, {s.num_heads} heads x head_dim {s.head_dim}, d_state "
            f"{s.state_size}, n_groups {s.n_groups}, conv width {s.conv_kernel}; recurrent state per request: "
            f"{(conv + ssm) / 2**20:.3f} MiB (conv {conv / 2**10:.1f} KiB in {str(dtype).removeprefix('torch.')} + "
            f"SSM {ssm / 2**10:.1f} KiB in float32), whatever the sequence length")


class StatePool:
    """Per-layer conv states ``conv[l]`` ``[rows, conv_dim, W-1]`` and SSM states ``ssm[l]`` ``[rows, H, P, N]``.

    Request row ``r`` is ``conv[:, r]`` ``[layers, conv_dim, W-1]`` (model dtype) and ``ssm[:, r]``
    ``[layers, H, P, N]`` (float32). ``allocator`` hands out rows as one-block block tables.
    """

    __slots__ = ("allocator", "conv", "ssm")
    WHAT: ClassVar[str] = "state pool"

    def __init__(self, config: ModelConfig, num_rows: int, max_model_len: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        """Zeroed rows for requests of up to `max_model_len` tokens.

        Raises:
            ConfigError: `config` is not a recurrent (Mamba-2) config.
        """
        s = config.ssm_dims()
        layers = config.num_layers
        self.conv = torch.zeros(layers, num_rows, s.conv_dim, s.conv_kernel - 1, dtype=dtype, device=device)
        self.ssm = torch.zeros(layers, num_rows, s.num_heads, s.head_dim, s.state_size, dtype=torch.float32,
                               device=device)
        self.allocator = BlockAllocator(num_rows, max_model_len)

    @staticmethod
    def unit_bytes(config: ModelConfig, options: EngineOptions) -> int:
        """Bytes of one row (one request's states over all layers) under `options` (its dtype)."""
        return sum(state_bytes(config, options.resolved_dtype(config)))

    @classmethod
    def for_engine(cls, config: ModelConfig, options: EngineOptions, device: torch.device) -> StatePool:
        """Rows: ``options.num_blocks`` when given, else as many as the memory budget holds
        (`infinilm.engine.memory.memory_budget`), at most ``max_num_seqs``.

        Raises:
            ConfigError: the rows need more memory than `device` has available (checked before allocating).
        """
        per_row = cls.unit_bytes(config, options)
        rows = cache_units(options, device, per_row, options.max_num_seqs)
        check_cache_fits(cls.WHAT, rows, per_row, options, device, now=True)
        return cls(config, rows, options.model_len(config), dtype=options.resolved_dtype(config), device=device)

    @property
    def num_rows(self) -> int:
        """Rows in the pool (the allocator's blocks)."""
        return self.allocator.num_blocks

    @staticmethod
    def row(seq: Sequence) -> int:
        """The row a running sequence owns (its one-block block table)."""
        return seq.block_table[0]
