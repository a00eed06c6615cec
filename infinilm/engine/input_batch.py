"""Persistent per-engine step inputs: one stable row per running sequence (vLLM's ``InputBatch`` and
``BlockTable``), so that a decode step's host work depends on the batch size only, never on max_model_len or
on the sequences' lengths (issue #24).

`SeqRows` gives each running sequence a row (``Sequence.row``) when the scheduler admits it and takes it back
when the sequence finishes, is preempted or is cancelled. Per row it keeps the sequence's block table, its
length and its last token. The scheduler writes a row's table when the row is given and when the sequence
gets a block (only the new entries); the engine advances lengths and last tokens with one array operation
after each step's sampling. A decode step then gathers its inputs (token, position, slot, context length,
row) with NumPy fancy indexing into one staging buffer and copies it, and the block tables' columns in use,
to the device: two copies per step whatever the batch, the context or max_model_len (an eager attention step
copies a third, its int32 context and cache lengths). The device views a step hands out are made once per batch
size. On the CPU a decode graph's static tables are written by NumPy straight from the rows, and when a step's
rows are the last step's, only the rows whose tables changed since (vLLM's changed-rows copy).

The host buffers are `CpuGpuBuffer`s (vLLM's ``CpuGpuBuffer``): pinned on CUDA, so the copies are
asynchronous; on the CPU the host tensor is the device tensor and nothing is copied. `BlockTable` keeps the
tables: on CUDA transposed, ``[max_blocks, max_rows]``, so that "the first `width` blocks of every row" is one
contiguous slice: a step copies ``width x max_rows`` entries, `width` being the longest table in the step, not
``max_model_len / block_size``, and the device gathers the step's rows from it; on the CPU row by row
(``[max_rows, max_blocks]``), the step's rows gathered by NumPy.

Under async scheduling (`infinilm.engine.overlap`) a step is launched before the previous step's sampled ids are
read: `launched` advances the lengths at launch and remembers, per row, where its next input token lies in the
step's ids on the device (``prev``); a decode step then takes those tokens from the device (one gather, no read
to the host), the others from `last`, which `resolved` fills once the ids are read (vLLM V1's async
scheduling, which also writes the next input ids from the sampled ids on the device).

A host buffer is rewritten only after its last copy to the device has completed (`SeqRows.writable`, which
waits on the event recorded after the copy): on rank 0 the step's read of the sampled ids has already
waited for it, so this never blocks there; a tensor-parallel follower, which reads nothing back, may wait.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence as Seq
from typing import Any, NamedTuple

import numpy as np
import torch

from infinilm.engine.kv_cache import CacheError

__all__ = ["BlockTable", "CpuGpuBuffer", "DecodeInputs", "SeqRows"]

# rows of the staging buffer: what a decode step gathers per sequence; PREV: the entry of the device's pending ids
# that holds the token (-1: the token is on the host)
TOKEN, POSITION, SLOT, LENGTH, ROW, PREV = range(6)
_ROW_OF = operator.attrgetter("row")


class DecodeInputs(NamedTuple):
    """An eager decode step's inputs on the device (`SeqRows.decode_inputs`), n sequences: int64 ``[n]`` token ids,
    positions and cache slots, int32 ``[n]`` context lengths (with the new token) and cache lengths (without it),
    and int32 ``[n, width]`` block tables."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    context_lens: torch.Tensor
    cache_seqlens: torch.Tensor
    block_tables: torch.Tensor


class _Views(NamedTuple):
    """Views of the device staging buffers' first n columns, made once per n (slicing a tensor costs a
    microsecond or two of host time): the whole step, its ROW row, its rows before ROW (a decode graph's
    values), its TOKEN, POSITION and SLOT rows, and the int32 context and cache lengths."""

    step: torch.Tensor
    row: torch.Tensor
    values: torch.Tensor
    token: torch.Tensor
    position: torch.Tensor
    slot: torch.Tensor
    context_lens: torch.Tensor
    cache_seqlens: torch.Tensor


class CpuGpuBuffer:
    """A host tensor (pinned on CUDA), its NumPy view, and a device tensor of the same shape and dtype.

    Attributes:
        cpu: the host tensor; `np` is its NumPy view (writes through).
        gpu: the device tensor; on the CPU it is `cpu` itself.
    """

    __slots__ = ("cpu", "gpu", "np")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        pinned = device.type == "cuda"
        self.cpu = torch.zeros(shape, dtype=dtype, pin_memory=pinned)
        self.np: np.ndarray[Any, Any] = self.cpu.numpy()
        self.gpu = torch.zeros(shape, dtype=dtype, device=device) if pinned else self.cpu

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        """Copy the first `n` entries of dim 0 (all when None), one contiguous slice, asynchronously; returns
        them on the device."""
        if n is None:
            if self.gpu is not self.cpu:
                self.gpu.copy_(self.cpu, non_blocking=True)
            return self.gpu
        if self.gpu is not self.cpu:
            self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


class BlockTable:
    """The rows' block tables, int32, in the layout of the module doc (vLLM's ``BlockTable``).

    Attributes:
        buffer: the host and device tensors (``[max_blocks, max_rows]`` on CUDA, ``[max_rows, max_blocks]`` on
            the CPU); a row's entries past its length are stale and never read.
    """

    __slots__ = ("buffer", "transposed")

    def __init__(self, max_rows: int, max_blocks: int, device: torch.device, *, transposed: bool | None = None) -> None:
        """`transposed`: the layout (None: transposed on CUDA, by rows on the CPU, where a test may ask for either).

        Raises:
            ValueError: ``transposed=False`` on CUDA (the device gathers from the transposed layout only).
        """
        if transposed is False and device.type == "cuda":
            raise ValueError("transposed=False: block tables on CUDA are transposed (see infinilm.engine.input_batch)")
        self.transposed = device.type == "cuda" if transposed is None else transposed
        shape = (max_blocks, max_rows) if self.transposed else (max_rows, max_blocks)
        self.buffer = CpuGpuBuffer(shape, torch.int32, device)

    def write(self, row: int, start: int, blocks: Seq[int]) -> None:
        """Entries ``start ..`` of row `row` become `blocks`."""
        stop = start + len(blocks)
        if self.transposed:
            self.buffer.np[start:stop, row] = blocks
        else:
            self.buffer.np[row, start:stop] = blocks

    def at(self, rows: np.ndarray[Any, Any], index: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Entry ``index[i]`` of row ``rows[i]`` for each i, from the host."""
        return self.buffer.np[index, rows] if self.transposed else self.buffer.np[rows, index]

    def copy_to_gpu(self, width: int) -> None:
        """Copy every row's first `width` entries to the device (CUDA; nothing on the CPU)."""
        if self.transposed:
            self.buffer.copy_to_gpu(width)

    def gather(self, rows: np.ndarray[Any, Any], rows_on_device: torch.Tensor | None, width: int) -> torch.Tensor:
        """The first `width` entries of `rows` (also given on the device; needed when transposed), int32
        ``[n, width]`` on the device: a gather on the device from the last `copy_to_gpu` (a transposed view), or
        by NumPy on the CPU."""
        if self.transposed:
            if rows_on_device is None:
                raise ValueError("rows_on_device: the transposed tables are gathered on the device")
            return self.buffer.gpu[:width].index_select(1, rows_on_device).t()
        return torch.from_numpy(self.buffer.np[rows, :width])


class SeqRows:
    """Stable rows of the running sequences: block tables, lengths and last tokens, and a decode step's
    inputs gathered from them.

    Attributes:
        max_rows: rows (at most this many sequences run at once: ``max_num_seqs``).
        max_blocks: entries of a row's block table (``max_model_len / block_size``; 1 for a recurrent model,
            whose one entry is the sequence's state row).
        block_size: tokens per KV-cache block.
        tables: the rows' block tables (`BlockTable`).
        num_blocks / lens / last: int64 ``[max_rows]``: per row its table's length, its sequence's length
            and its last token.
        step: int64 ``[6, max_rows]``, the staging buffer of a decode step's token, position, slot, context
            length, row and PREV.
        prev / pending: int64 ``[max_rows]``, per row the entry of `pending` (the last launched step's sampled
            ids on the device, not yet read) that is its sequence's last token, -1 where `last` holds it; and
            `pending` itself, or None (see the module doc).
    """

    def __init__(self, max_rows: int, max_blocks: int, block_size: int, device: torch.device, *,
                 transposed: bool | None = None) -> None:
        """`transposed`: the tables' layout (`BlockTable`)."""
        self.max_rows, self.max_blocks, self.block_size, self.device = max_rows, max_blocks, block_size, device
        self.tables = BlockTable(max_rows, max_blocks, device, transposed=transposed)
        self.step = CpuGpuBuffer((6, max_rows), torch.int64, device)
        # one array, so that a step gathers the four per-row values of its rows in one `take`
        self._state = np.zeros((4, max_rows), dtype=np.int64)
        self.last, self.lens, self.prev, self.num_blocks = self._state  # views: writes go to `_state`
        self.prev.fill(-1)
        self.pending: torch.Tensor | None = None
        self.lens32 = CpuGpuBuffer((2, max_rows), torch.int32, device)  # an eager step's context and cache lengths
        self._views: dict[int, _Views] = {}
        # `decode_step`'s `tables_out`: the last one written, the rows written into it (in order) and each row's
        # place there (-1: none); and the rows whose tables changed since (only those are written again)
        self._out: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None
        self._changed: set[int] = set()
        self._free = list(range(max_rows - 1, -1, -1))  # pop() hands out the lowest free row
        self._copied: torch.cuda.Event | None = None

    @property
    def num_free(self) -> int:
        """Rows no sequence holds."""
        return len(self._free)

    # -- what the scheduler tells it -----------------------------------------------------------------
    def add(self, seq: Any) -> None:
        """Give `seq` (just admitted: its blocks allocated) a row, and write its table, length and last token.

        Raises:
            CacheError: every row is taken, or `seq` holds one already (nothing changes then).
        """
        if getattr(seq, "row", None) is not None:
            raise CacheError(f"sequence {seq.id} holds row {seq.row} already")
        if not self._free:
            raise CacheError(f"no free row: all {self.max_rows} are taken (max_num_seqs)")
        row = self._free.pop()
        seq.row = row
        self.load(row, seq.block_table, len(seq), seq.tokens[-1])

    def load(self, row: int, table: Seq[int], length: int, last: int) -> None:
        """Write row `row` whole: its block table, sequence length and last token (a follower mirrors rank 0's
        rows so; `add` writes a new row so)."""
        n = len(table)
        if n > self.max_blocks:
            raise CacheError(f"a block table of {n} blocks exceeds the {self.max_blocks} a row holds")
        self.tables.write(row, 0, table)
        self._changed.add(row)
        self.num_blocks[row], self.lens[row], self.last[row], self.prev[row] = n, length, last, -1

    def mirror(self, batch: Any) -> None:
        """A tensor-parallel follower: update this copy of rank 0's rows from a broadcast step's batch of
        `infinilm.distributed.step.StepSeq` (a prefill's row loaded whole; a decode's table told its length and
        last block, the one block a decode step can add, its length and last token)."""
        for s in batch.prefills:
            if s.row is not None:
                self.load(s.row, s.block_table, len(s), s.tokens[-1])
        for s in batch.decodes:
            n, row = s.num_blocks, s.row
            if not 0 < n <= self.max_blocks:
                raise CacheError(f"a block table of {n} blocks: a row holds 1 to {self.max_blocks}")
            self.tables.write(row, n - 1, s.block_table[-1:])
            self._changed.add(row)
            self.num_blocks[row], self.lens[row], self.last[row] = n, len(s), s.tokens[-1]

    def grow(self, seq: Any) -> None:
        """Write the blocks `seq` got since its row was last written (its table only grows while it runs)."""
        row = seq.row
        old, new = int(self.num_blocks[row]), len(seq.block_table)
        if new > old:
            if new > self.max_blocks:
                raise CacheError(f"a block table of {new} blocks exceeds the {self.max_blocks} a row holds")
            self.tables.write(row, old, seq.block_table[old:])
            self._changed.add(row)
            self.num_blocks[row] = new

    def remove(self, seq: Any) -> None:
        """Take back the row of `seq` (finished, preempted or cancelled); nothing when it holds none."""
        row = getattr(seq, "row", None)
        if row is None:
            return
        seq.row = None
        self.num_blocks[row] = 0
        self._free.append(row)

    # -- per step ------------------------------------------------------------------------------------
    @staticmethod
    def rows_of(seqs: Seq[Any]) -> np.ndarray[Any, Any]:
        """The rows of `seqs`, int64 ``[len(seqs)]``."""
        return np.fromiter(map(_ROW_OF, seqs), dtype=np.int64, count=len(seqs))

    def advance(self, rows: np.ndarray[Any, Any], tokens: Seq[int]) -> None:
        """After a step: each sequence of `rows` got one token, `tokens` in the same order."""
        self.lens[rows] += 1
        self.last[rows] = tokens

    def launched(self, rows: np.ndarray[Any, Any], ids: torch.Tensor) -> None:
        """Async scheduling: a step over `rows` was launched and its sampled ids `ids` (``[len(rows)]``, on the
        device) are not read yet: each sequence's length counts its coming token, which the next decode step
        takes from `ids` on the device."""
        self.lens[rows] += 1
        self.prev.fill(-1)
        self.prev[rows] = np.arange(len(rows))
        self.pending = ids

    def resolved(self, rows: np.ndarray[Any, Any], tokens: Seq[int], latest: bool) -> None:
        """Async scheduling: the ids of a step over `rows` were read, `tokens` in the same order; `latest`: no
        step was launched after it, so no row's token is on the device any more."""
        self.last[rows] = tokens
        if latest:
            self.prev.fill(-1)
            self.pending = None

    def _device_tokens(self, step: torch.Tensor, src: np.ndarray[Any, Any]) -> None:
        """Overwrite the TOKEN row of `step` (on the device, n columns) with the pending ids where `src` (the
        PREV row on the host) says so: a gather on the device, nothing read back."""
        if self.pending is None or not (src >= 0).any():
            return
        pending = self.pending.clamp_min(0)  # -1 (non-finite logits) ends that request: its next token is dropped
        if (src >= 0).all():
            step[TOKEN].copy_(pending.index_select(0, step[PREV]))
        else:
            gathered = pending.index_select(0, step[PREV].clamp_min(0))
            step[TOKEN].copy_(torch.where(step[PREV] >= 0, gathered, step[TOKEN]))

    def writable(self) -> None:
        """Wait until the last copy of the host buffers to the device has completed (see the module doc);
        call it before a step writes them."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None

    def decode_step(self, rows: np.ndarray[Any, Any], *, values: bool = False,
                    tables_out: np.ndarray[Any, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The inputs of a decode step over `rows` (n of them), on the device: the int64 ``[5, n]`` token,
        position (length - 1), cache slot of the new token, context length (with the new token) and row of
        each (`values`: only the first four, ``[4, n]``, as a decode graph takes them), and their block tables,
        int32 ``[n, width]`` (width: the longest among them; any strides). `tables_out` (the CPU layout only: a
        decode graph's static tables, int32 ``[>= n, >= width]``): the tables are gathered into its first
        `n` rows and `width` columns instead, by NumPy, and None is returned for them (one copy, not two)."""
        n = len(rows)
        st = self.step.np
        last, lens, prev, num_blocks = self._state.take(rows, 1)
        st[TOKEN, :n] = last
        positions = st[POSITION, :n]
        np.subtract(lens, 1, out=positions)
        bs = self.block_size
        index, offset = np.divmod(positions, bs)
        slots = st[SLOT, :n]
        np.multiply(self.tables.at(rows, index), bs, out=slots, dtype=np.int64)
        slots += offset
        st[LENGTH, :n] = lens
        st[ROW, :n] = rows
        src = st[PREV, :n]
        src[:] = prev
        width = int(num_blocks.max()) if n else 0
        self.step.copy_to_gpu()
        v = self._step_view(n)
        self.tables.copy_to_gpu(width)
        self._record()
        self._device_tokens(v.step, src)
        first = v.values if values else v.step
        if tables_out is not None:
            if self.tables.transposed:
                raise ValueError("tables_out: the transposed tables are gathered on the device")
            self._tables_into(tables_out, rows, width)
            return first, None
        return first, self.tables.gather(rows, v.row if self.tables.transposed else None, width)

    def _tables_into(self, out: np.ndarray[Any, Any], rows: np.ndarray[Any, Any], width: int) -> None:
        """Gather the tables of `rows` into `out`'s first rows (the CPU layout): when the last call wrote the same
        rows into the same `out`, only the rows whose tables changed since (a few a step, none on most), else all
        of them, `width` wide (vLLM's block table copies changed rows only)."""
        last, src, changed = self._out, self.tables.buffer.np, self._changed
        if (last is not None and last[0] is out and last[1].shape == rows.shape and np.array_equal(last[1], rows)
                and 4 * len(changed) < len(rows)):
            where = last[2]
            for row in changed:
                i = where[row]
                if i >= 0:
                    k = self.num_blocks[row]
                    out[i, :k] = src[row, :k]
        else:
            n = len(rows)
            out[:n, :width] = src[rows, :width]
            where = np.full(self.max_rows, -1, dtype=np.int64)
            where[rows] = np.arange(n)
            self._out = (out, rows.copy(), where)
        changed.clear()

    def _step_view(self, n: int) -> _Views:
        """The `_Views` of `n` columns (made on the first step of `n` sequences)."""
        views = self._views.get(n)
        if views is None:
            with torch.inference_mode(False):  # normal views, which a step may write in place in or out of it
                step, lens = self.step.gpu[:, :n], self.lens32.gpu[:, :n]
                views = self._views[n] = _Views(step, step[ROW], step[:ROW], step[TOKEN], step[POSITION],
                                                step[SLOT], lens[0], lens[1])
        return views

    def decode_inputs(self, rows: np.ndarray[Any, Any]) -> DecodeInputs:
        """`decode_step`'s inputs as an eager attention step takes them, the lengths also as int32 (from the host:
        one more copy instead of casts on the device)."""
        _, tables = self.decode_step(rows)
        n = len(rows)
        lens = self.lens32.np
        lens[0, :n] = self.step.np[LENGTH, :n]
        lens[1, :n] = self.step.np[POSITION, :n]
        self.lens32.copy_to_gpu()
        self._record()
        v = self._step_view(n)
        return DecodeInputs(v.token, v.position, v.slot, v.context_lens, v.cache_seqlens, tables.contiguous())

    def recurrent_step(self, rows: np.ndarray[Any, Any]) -> torch.Tensor:
        """The inputs of a recurrent model's decode step over `rows` (n of them) on the device: int64 ``[2, n]``,
        each one's last token and state row (its table's one entry)."""
        n = len(rows)
        st = self.step.np
        st[TOKEN, :n] = self.last[rows]
        st[1, :n] = self.tables.at(rows, np.zeros(n, dtype=np.int64))
        src = st[PREV, :n]
        src[:] = self.prev[rows]
        self.step.copy_to_gpu()
        step = self._step_view(n).step
        self._record()
        self._device_tokens(step, src)
        return step[:2]

    def _record(self) -> None:
        """Mark the copies just queued on the device's current stream (what `writable` waits for)."""
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(self.device))
