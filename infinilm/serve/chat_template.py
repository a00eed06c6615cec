"""The checkpoint's chat template, rendered by transformers (its Jinja sandbox and the template's own globals).

The template is ``chat_template`` of ``tokenizer_config.json`` (a string, or Hugging Face's list of named
templates, of which ``default`` is taken), else the ``chat_template.jinja`` file transformers writes beside
it. It is rendered with ``add_generation_prompt=True`` by `transformers.PreTrainedTokenizerFast`'s
``apply_chat_template`` over the checkpoint's ``tokenizer.json``, with the special tokens
(``bos_token``, ``eos_token``, ...) of ``tokenizer_config.json``, exactly as ``AutoTokenizer`` would
render it; the server then encodes the text without adding special tokens (the template writes them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from infinilm.config_checks import ConfigError
from infinilm.serve.errors import bad_request

__all__ = ["load_chat_template"]

_SPECIAL: Final = ("bos_token", "eos_token", "unk_token", "pad_token")


def load_chat_template(path: str | Path) -> Callable[[list[dict[str, str]]], str] | None:
    """A function rendering messages with the chat template of checkpoint `path`, or None when it has none.

    The function raises `infinilm.serve.errors.APIError` (400, param ``messages``) when the template refuses
    the messages (templates call ``raise_exception`` for, e.g., roles out of order).

    Raises:
        ConfigError: ``tokenizer_config.json`` cannot be read or is not a JSON object (invalid JSON, or
            nested too deeply to parse), or the template does not compile.
    """
    path = Path(path)
    config_file, jinja_file = path / "tokenizer_config.json", path / "chat_template.jinja"
    config: dict[str, Any] = {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
            raise ConfigError(f"{config_file}: not valid JSON ({str(err)[:200]})") from None
        except OSError as err:
            raise ConfigError(f"{config_file}: cannot be read ({err.strerror or err})") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{config_file}: must be a JSON object")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    if not isinstance(template, str) or not (path / "tokenizer.json").is_file():
        return None
    from jinja2 import TemplateSyntaxError
    from transformers import PreTrainedTokenizerFast

    special = {k: _token_text(config[k]) for k in _SPECIAL if config.get(k) is not None}
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), chat_template=template,
                                        **special)

    def render(messages: list[dict[str, str]]) -> str:
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as err:  # a template may raise anything (raise_exception, an undefined attribute, ...)
            raise bad_request("messages", f"the model's chat template refuses these messages: {err}") from None

    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    except TemplateSyntaxError as err:
        raise ConfigError(f"{path}: the chat template does not compile: {err}") from None
    except Exception:  # a template may refuse this probe conversation and still serve others
        pass
    return render


def _token_text(value: Any) -> str:
    # tokenizer_config.json writes a special token as its text or as an AddedToken dict {"content": ...}
    return value["content"] if isinstance(value, dict) else str(value)
