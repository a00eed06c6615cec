"""Text in and out: ``tokenizer.json`` through the `tokenizers` library, and streaming detokenization."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
    """Turns a growing list of token ids into text increments.

    Decodes the whole output each time and emits what is new; text ending in U+FFFD (a multi-byte
    character whose bytes have not all arrived) is held back until it completes.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.emitted = 0

    def push(self, ids: list[int]) -> str:
        """The text `ids` (the whole output so far) adds to what was returned before; empty while a character
        is incomplete."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        new, self.emitted = text[self.emitted:], len(text)
        return new
