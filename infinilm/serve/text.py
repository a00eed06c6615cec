"""A request's output text, token by token, with stop strings.

With a tokenizer, each token's text comes from `infinilm.tokenizer.StreamDecoder` (incremental: the text is
the whole output's decoding, special tokens skipped, as ``infinilm generate`` prints it, at a cost per token
that does not grow with the output); the U+FFFD characters that end the text (a character whose bytes have
not all arrived) are held back until it completes, or the output ends. A stop string ends the output before
it (vLLM's and OpenAI's semantics: the stop string is not included), also when the token that completes it
ends on an incomplete character (byte-level BPE merges cross characters), and when the output ends; text
that could be the start of a stop string is held back until it is known not to be. Stop strings are matched
as the text arrives (Knuth-Morris-Pratt: one automaton state per stop string, no search over the text so far),
so a token costs the same at any output length; only the held-back tail is kept.
Without a tokenizer (a checkpoint with token ids only) each token's text is its id and a space, as
``infinilm generate`` prints it.
"""

from __future__ import annotations

from typing import Any

from infinilm.tokenizer import StreamDecoder

__all__ = ["TextOutput"]


class TextOutput:
    """Text increments of one request's output.

    Attributes:
        stopped: a stop string has been found (no text comes after it).
        stop_string: the stop string that ended the output (vLLM's ``stop_reason``): of those found in the same
            token's text, the one that begins first (the first in `stop` of those that begin there); else None.
    """

    def __init__(self, tokenizer: Any | None, stop: tuple[str, ...] = ()) -> None:
        self.stop = stop
        self.stopped = False
        self.stop_string: str | None = None
        self._decoder = StreamDecoder(tokenizer) if tokenizer is not None else None
        self._matchers = [_Matcher(s) for s in stop]
        self._held = ""  # text decoded but not returned: it may be the start of a stop string

    def push(self, token: int) -> str:
        """Add one token; returns the text that is now final (possibly ""), up to a stop string if one appears."""
        if self._decoder is None:
            return f"{token} "
        return "" if self.stopped else self._scan(self._decoder.push(token), final=False)

    def flush(self) -> str:
        """The text held back (an incomplete character or stop string) when the output ends, up to a stop string
        found in it; "" after a stop string."""
        if self._decoder is None or self.stopped:
            return ""
        return self._scan(self._decoder.flush(), final=True)

    def _scan(self, new: str, *, final: bool) -> str:
        """The part of the held text and `new` now known to be output; sets `stopped` at a stop string."""
        if not self._matchers:
            return new
        text, base = self._held + new, len(self._held)
        starts = [(base + end - len(m.stop), i) for i, m in enumerate(self._matchers) if (end := m.feed(new)) >= 0]
        if starts:  # the earliest stop string found ends the output
            start, i = min(starts)
            self.stopped, self.stop_string, self._held = True, self.stop[i], ""
            return text[:start]
        keep = 0 if final else max(m.state for m in self._matchers)  # a proper start of a stop string
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]


class _Matcher:
    """One stop string's Knuth-Morris-Pratt automaton: `state` is the length of the longest end of the text fed
    so far that is a proper start of `stop`."""

    __slots__ = ("fail", "state", "stop")

    def __init__(self, stop: str) -> None:
        self.stop, self.state = stop, 0
        self.fail = [0] * len(stop)  # fail[i]: the longest proper border of stop[:i + 1]
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = self.fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            self.fail[i] = k

    def feed(self, chunk: str) -> int:
        """Advance over `chunk`; returns the index in `chunk` just past the first match's end, or -1."""
        stop, fail, k = self.stop, self.fail, self.state
        for i, c in enumerate(chunk):
            while k and stop[k] != c:
                k = fail[k - 1]
            if stop[k] == c:
                k += 1
                if k == len(stop):
                    self.state = k
                    return i + 1
        self.state = k
        return -1
