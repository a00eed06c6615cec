"""The scheduler: which sequences run in the next step, with continuous batching and admission control.

Each step first gives every running sequence one decode token (growing its block table when its next
token starts a new block), then admits waiting sequences, oldest first, as prefills in the same step while
the token budget, the sequence limit and the free KV blocks allow. A waiting request that does not fit
stays queued (admission control: never an error, never a partial allocation). When a running sequence
needs a block and none is free, the newest running sequence is preempted: its blocks are freed and it
returns to the front of the queue, to be recomputed from its tokens later (vLLM's recompute preemption).

The scheduler tells the engine's `infinilm.engine.input_batch.SeqRows` (when it has one) what changes a running
sequence's row: a row is given at admission, a block table grows, a row is taken back at finish, preemption
and cancellation.
"""

from __future__ import annotations

from collections import deque

from infinilm.batch import Batch
from infinilm.engine.input_batch import SeqRows
from infinilm.engine.kv_cache import BlockAllocator
from infinilm.engine.sequence import FinishReason, SeqStatus, Sequence

__all__ = ["Scheduler"]


class Scheduler:
    """Holds the waiting queue and the running set over one block allocator."""

    def __init__(self, allocator: BlockAllocator, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: tuple[int, ...] = (), rows: SeqRows | None = None) -> None:
        """`rows`: the persistent rows to keep up to date (at least `max_num_seqs` of them), or None."""
        self.allocator = allocator
        self.rows = rows
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence.

        Raises:
            ValueError: the prompt is longer than ``max_model_len - 1`` or needs more blocks than the cache has.
        """
        if len(seq) >= self.max_model_len:
            raise ValueError(
                f"prompt: {len(seq)} tokens leave no room to generate (max_model_len={self.max_model_len})")
        if self.allocator.blocks_needed(len(seq) + 1) > self.allocator.num_blocks:
            raise ValueError(f"prompt: {len(seq)} tokens need more KV blocks than the cache holds "
                             f"({self.allocator.num_blocks} of {self.allocator.block_size} tokens)")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Whether a sequence is waiting or running."""
        return bool(self.waiting or self.running)

    def schedule(self) -> Batch[Sequence]:
        """Pick the next step's batch and reserve the KV blocks it writes."""
        batch: Batch[Sequence] = Batch()
        decodes, running, alloc = batch.decodes, self.running, self.allocator
        bs = alloc.block_size
        i = 0
        while i < len(running):
            seq = running[i]
            if len(seq.tokens) > len(seq.block_table) * bs:  # its next token starts a block
                need = alloc.blocks_needed(len(seq), len(seq.block_table))
                while not alloc.can_allocate(need) and len(running) - 1 > i:
                    self._preempt(running[-1])
                if not alloc.can_allocate(need):
                    self._preempt(seq)
                    break
                alloc.append(seq.block_table, len(seq))
                if self.rows is not None:
                    self.rows.grow(seq)
            decodes.append(seq)
            i += 1
        tokens = len(batch.decodes)
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if tokens + len(seq) > self.max_num_batched_tokens:
                break
            need = self.allocator.blocks_needed(len(seq))
            if not self.allocator.can_allocate(need):
                break
            self.waiting.popleft()
            self.allocator.append(seq.block_table, len(seq))
            if self.rows is not None:
                self.rows.add(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            batch.prefills.append(seq)
            tokens += len(seq)
        return batch

    def postprocess(self, batch: Batch[Sequence], tokens: list[int]) -> list[Sequence]:
        """Append each sequence's new token, finish those at a stop token or their length limit; returns those.

        The length limit is checked first (``max_new_tokens`` output tokens, or ``max_model_len`` tokens in all:
        `FinishReason.LENGTH`, also when that last token is a stop token); then a token in the sequence's
        ``stop_token_ids`` finishes it (`FinishReason.EOS`), and one of the model's EOS ids does unless its
        ``ignore_eos`` is set. This is vLLM's order (``vllm/v1/core/sched/utils.py``, ``check_stop``).
        A token of -1 (the sampler's mark of non-finite logits) is not appended: it finishes the sequence with
        `FinishReason.ERROR` and the reason in `Sequence.error`.
        """
        finished = []
        max_len, eos = self.max_model_len, self.eos_token_ids
        for seq, token in zip(batch.seqs, tokens, strict=True):
            seq_tokens = seq.tokens
            seq.num_cached = len(seq_tokens)
            if token < 0:  # the sampler's mark of a row of non-finite logits
                seq.error = ("the model's logits for this request are non-finite (NaN or inf): no token can be "
                             "sampled")
                self._finish(seq, FinishReason.ERROR)
                finished.append(seq)
                continue
            seq_tokens.append(token)
            p = seq.params
            n = len(seq_tokens)
            if n - seq.num_prompt >= p.max_new_tokens or n >= max_len:
                self._finish(seq, FinishReason.LENGTH)
            elif token in p.stop_token_ids or (not p.ignore_eos and token in eos):
                self._finish(seq, FinishReason.EOS)
            else:
                continue
            finished.append(seq)
        return finished

    def cancel(self, seq: Sequence) -> bool:
        """Stop `seq` wherever it is and free its blocks; False when it had already finished."""
        if seq.finished:
            return False
        if seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
            seq.status, seq.finish_reason = SeqStatus.FINISHED, FinishReason.CANCELLED
        else:
            self._finish(seq, FinishReason.CANCELLED)
        return True

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.block_table = []
        seq.status, seq.finish_reason = SeqStatus.FINISHED, reason

    def _release(self, seq: Sequence) -> None:
        self.allocator.free(seq.block_table)
        if self.rows is not None:
            self.rows.remove(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.block_table, seq.num_cached, seq.status = [], 0, SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
