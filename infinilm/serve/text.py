"""A request's output text, token by token, with stop strings.

With a tokenizer, the text is the whole output decoded by `tokenizers` (special tokens skipped, as
``infinilm generate`` prints it) and each token adds what is new; the U+FFFD characters that end the text (a
character whose bytes have not all arrived) are held back until it completes, or the output ends. A stop
string ends the output before it (vLLM's and OpenAI's semantics: the stop string is not included), also when
the token that completes it ends on an incomplete character (byte-level BPE merges cross characters), and when
the output ends; text that could be the start of a stop string is held back until it is known not to be.
Without a tokenizer (a checkpoint with token ids only) each token's text is its id and a space, as
``infinilm generate`` prints it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TextOutput"]


class TextOutput:
    """Text increments of one request's output.

    Attributes:
        ids: the output token ids so far.
        stopped: a stop string has been found (no text comes after it).
    """

    def __init__(self, tokenizer: Any | None, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.stopped = False
        self._sent = 0  # characters of the decoded text already returned

    def push(self, token: int) -> str:
        """Add one token; returns the text that is now final (possibly ""), up to a stop string if one appears."""
        self.ids.append(token)
        if self.tokenizer is None:
            return f"{token} "
        return self._advance(self.tokenizer.decode(self.ids, skip_special_tokens=True), final=False)

    def flush(self) -> str:
        """The text held back (an incomplete character or stop string) when the output ends, up to a stop string
        found in it; "" after a stop string."""
        if self.tokenizer is None or self.stopped:
            return ""
        return self._advance(self.tokenizer.decode(self.ids, skip_special_tokens=True) if self.ids else "", final=True)

    def _advance(self, text: str, *, final: bool) -> str:
        """The part of the decoded `text` now known to be output; sets `stopped` at a stop string."""
        if not final:
            text = text.rstrip("\ufffd")  # a character whose bytes have not all arrived
        end = len(text)
        if self.stop:
            found = [i for i in (text.find(s, max(0, self._sent - len(s) + 1)) for s in self.stop) if i >= 0]
            if found:
                self.stopped = True
                end = min(found)
            elif not final:
                end -= max((_overlap(text, s) for s in self.stop), default=0)
        end = max(end, self._sent)
        new, self._sent = text[self._sent:end], end
        return new


def _overlap(text: str, stop: str) -> int:
    """The length of the longest end of `text` that is a proper start of `stop`."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
