"""Text in and out: ``tokenizer.json`` through the `tokenizers` library, and incremental detokenization."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

from infinilm.config_checks import ConfigError
from infinilm.files import file_kind

__all__ = ["StreamDecoder", "load_tokenizer"]


def load_tokenizer(path: str | Path) -> Any | None:
    """The `tokenizers.Tokenizer` of ``<path>/tokenizer.json``, or None when the checkpoint has none (no
    ``tokenizer.json`` entry at all).

    Raises:
        ConfigError: `path` is not a directory (so it is not a checkpoint without a tokenizer); a tokenizer.json
            that is not a regular file (a link to a missing file, a directory, a FIFO, which is never opened); a
            file that is not a tokenizer `tokenizers` can read (the message names the file).
    """
    if not Path(path).is_dir():
        what = "is a file" if Path(path).exists() else "does not exist"
        raise ConfigError(f"{path} {what} (expected a Hugging Face checkpoint directory)")
    file = Path(path) / "tokenizer.json"
    if not os.path.lexists(file):
        return None
    what = file_kind(file)
    if what is not None:
        what = "a link to a missing file" if what == "missing" else what  # the name exists (lexists)
        raise ConfigError(f"{file}: not a readable tokenizer: it is {what}")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception for a malformed file
        raise ConfigError(f"{file}: not a readable tokenizer ({err})") from None


class StreamDecoder:
    """Turns token ids, pushed one at a time, into text increments, decoding only the last few tokens.

    The offsets of vLLM's and TGI's detokenizers (`tokenizers`' ``DecodeStream`` works the same way): each
    `push` decodes the window from `prefix` (the start of the last piece returned: context for decoders whose
    text depends on the token before, such as Metaspace's leading space or WordPiece's ``##``) to the end, and
    returns what the window adds after the prefix's own text. The U+FFFD characters that end the window's text
    (a character whose bytes have not all arrived) are held back until it completes, or `flush`; the text before
    them is returned at once. So the text returned is the whole output's decoding, at a cost per token that does
    not grow with the output: a window holds at most ``2 * (MAX_PENDING + 1)`` tokens. Bytes that are not UTF-8
    for more than `MAX_PENDING` tokens in a row (no character has more than 4 bytes) are returned as the
    U+FFFD they decode to.

    Attributes:
        ids: every token id pushed.
    """

    MAX_PENDING: Final = 16

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = self._read = 0  # the window's start; its first token no piece returned has ended
        self._prefix_text = ""  # the decoding of ids[prefix:read]
        self._sent = 0  # characters after the prefix's text already returned

    def push(self, token: int) -> str:
        """Add one token; returns the text that is now final (possibly "")."""
        self.ids.append(token)
        text = self._window()
        if text.endswith("\ufffd") and len(self.ids) - self._read <= self.MAX_PENDING:
            stable = text.rstrip("\ufffd")  # a character whose bytes have not all arrived ends it
            new = stable[self._sent:]
            self._sent = max(self._sent, len(stable))
            return new
        return self._advance(text)

    def flush(self) -> str:
        """The text held back when the output ends (an incomplete character, as U+FFFD); "" if none."""
        return self._advance(self._window()) if self._read < len(self.ids) else ""

    def _window(self) -> str:
        return self.tokenizer.decode(self.ids[self._prefix:], skip_special_tokens=True)[len(self._prefix_text):]

    def _advance(self, text: str) -> str:
        new = text[self._sent:]
        self._prefix, self._read, self._sent = self._read, len(self.ids), 0
        self._prefix_text = self.tokenizer.decode(self.ids[self._prefix:], skip_special_tokens=True)
        return new
