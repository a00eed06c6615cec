"""The scheduler: which sequences run in the next step, with continuous batching and admission control.

Each step first gives every running sequence one decode token (growing its block table when its next
token starts a new block), then admits waiting sequences, oldest first, as prefills in the same step while
the token budget, the sequence limit and the free KV blocks allow. A waiting request that does not fit
stays queued (admission control: never an error, never a partial allocation). When a running sequence
needs a block and none is free, the newest running sequence is preempted: its blocks are freed and it
returns to the front of the queue, to be recomputed from its tokens later (vLLM's recompute preemption).

Under async scheduling (`infinilm.engine.overlap`) the next step is scheduled while the last one runs, its
sampled ids not yet read: ``schedule(pending=True)`` counts one more token for every running sequence (vLLM's
output placeholders). A sequence that finishes, or is cancelled, while a step that computes it is in flight
leaves the running set at once but keeps its blocks and row until that step's ids are read
(`release_deferred`: one step late, as vLLM frees them; its row still counts against ``max_num_seqs``), and
`postprocess` gives it no token of that step.

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
        self.deferred: list[Sequence] = []  # finished while a step computing them is in flight: blocks held
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
        p = seq.params
        seq.stop_len = min(seq.num_prompt + p.max_new_tokens, self.max_model_len)
        seq.stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else self.eos_token_ids)
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Whether a sequence is waiting or running."""
        return bool(self.waiting or self.running)

    def can_continue(self) -> bool:
        """Whether every running sequence can get the block its next token needs without a preemption (async
        scheduling preempts only once no step is in flight: a preempted sequence is recomputed from its
        tokens, which must all be on the host)."""
        alloc, bs = self.allocator, self.allocator.block_size
        if alloc.num_free >= len(self.running):  # a decode step adds one block per sequence at most
            return True
        need = sum(len(s.tokens) + 1 > len(s.block_table) * bs for s in self.running)
        return alloc.can_allocate(need)

    def schedule(self, pending: bool = False) -> Batch[Sequence]:
        """Pick the next step's batch and reserve the KV blocks it writes; `pending`: every running sequence has
        one token more than its `Sequence.tokens` (the in-flight step's, not read yet: async scheduling)."""
        batch: Batch[Sequence] = Batch()
        decodes, running, alloc = batch.decodes, self.running, self.allocator
        bs = alloc.block_size
        extra = int(pending)
        i = 0
        if not [s for s in running if len(s.tokens) + extra > len(s.block_table) * bs]:
            decodes.extend(running)  # no sequence's next token starts a block (most steps): the loop below, faster
            i = len(running)
        while i < len(running):
            seq = running[i]
            n = len(seq.tokens) + extra
            if n > len(seq.block_table) * bs:  # its next token starts a block
                need = alloc.blocks_needed(n, len(seq.block_table))
                while not alloc.can_allocate(need) and len(running) - 1 > i:
                    self._preempt(running[-1])
                if not alloc.can_allocate(need):
                    self._preempt(seq)
                    break
                alloc.append(seq.block_table, n)
                if self.rows is not None:
                    self.rows.grow(seq)
            decodes.append(seq)
            i += 1
        tokens = len(batch.decodes)
        held = len(self.deferred)  # finished, their rows not yet free (async scheduling)
        while self.waiting and len(self.running) + held < self.max_num_seqs:
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

    def postprocess(self, batch: Batch[Sequence], tokens: list[int], *, in_flight: bool = False) -> list[Sequence]:
        """Append each sequence's new token, finish those at a stop token or their length limit; returns those.

        A sequence already finished (or cancelled) gets no token: under async scheduling it finished while this
        step was in flight, and this is the extra token the step computed for it. `in_flight`: a later step that
        computes every running sequence is in flight, so those that finish now keep their blocks until it is
        read (`release_deferred`).

        The length limit is checked first (``max_new_tokens`` output tokens, or ``max_model_len`` tokens in all:
        `FinishReason.LENGTH`, also when that last token is a stop token); then a token in the sequence's
        ``stop_token_ids`` finishes it (`FinishReason.EOS`), and one of the model's EOS ids does unless its
        ``ignore_eos`` is set. This is vLLM's order (``vllm/v1/core/sched/utils.py``, ``check_stop``).
        A token of -1 (the sampler's mark of non-finite logits) is not appended: it finishes the sequence with
        `FinishReason.ERROR` and the reason in `Sequence.error`.
        """
        finished = []
        done = SeqStatus.FINISHED
        for seq, token in zip(batch.seqs, tokens, strict=True):
            if seq.status is done:
                continue
            seq_tokens = seq.tokens
            n = seq.num_cached = len(seq_tokens)
            if token < 0:  # the sampler's mark of a row of non-finite logits
                seq.error = ("the model's logits for this request are non-finite (NaN or inf): no token can be "
                             "sampled")
                self._finish(seq, FinishReason.ERROR, in_flight)
                finished.append(seq)
                continue
            seq_tokens.append(token)
            if n >= seq.stop_len - 1:  # max_new_tokens output tokens, or max_model_len tokens (set by `add`)
                self._finish(seq, FinishReason.LENGTH, in_flight)
            elif token in seq.stop_ids:  # its stop_token_ids, and the model's EOS ids unless ignore_eos
                self._finish(seq, FinishReason.EOS, in_flight)
            else:
                continue
            finished.append(seq)
        return finished

    def cancel(self, seq: Sequence, *, in_flight: bool = False) -> bool:
        """Stop `seq` wherever it is and free its blocks (`in_flight`: a step computing every running sequence is
        in flight, so a running one's blocks are freed once that step is read: `release_deferred`); False when
        it had already finished."""
        if seq.finished:
            return False
        if seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
            seq.status, seq.finish_reason = SeqStatus.FINISHED, FinishReason.CANCELLED
        else:
            self._finish(seq, FinishReason.CANCELLED, in_flight)
        return True

    def release_deferred(self, seqs: list[Sequence]) -> None:
        """Free the blocks and rows of `seqs` (taken from `deferred`, finished while a step that computes them
        was in flight, once that step's ids have been read)."""
        for seq in seqs:
            self._release(seq)
            seq.block_table = []

    def take_deferred(self) -> list[Sequence]:
        """The sequences finished while the step in flight now was (`release_deferred` them once it is read);
        `deferred` starts empty again."""
        seqs, self.deferred = self.deferred, []
        return seqs

    def _finish(self, seq: Sequence, reason: FinishReason, in_flight: bool = False) -> None:
        self.running.remove(seq)
        seq.status, seq.finish_reason = SeqStatus.FINISHED, reason
        if in_flight:
            self.deferred.append(seq)
        else:
            self._release(seq)
            seq.block_table = []

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
