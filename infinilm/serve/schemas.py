"""Validation of ``/v1/completions`` and ``/v1/chat/completions`` bodies into one `GenerationRequest`.

Every field is checked before the engine sees the request, and every refusal is a 400 whose ``param`` names
the field (`infinilm.serve.errors`). The accepted fields are the OpenAI API's (their types and ranges are
OpenAI's, the sampling ranges are `infinilm.engine.sequence.SamplingParams`'), plus vLLM's sampling extensions
``top_k``, ``ignore_eos``, ``stop_token_ids`` and ``return_token_ids``. Decisions written down here:

- An unknown field is refused (a misspelt ``max_token`` would otherwise be ignored without a word). Fields
  of the API that the engine does not implement (``n``, ``logprobs``, ``echo``, penalties, ...) are
  accepted at their neutral value only (``n: 1``, ``presence_penalty: 0``) and refused otherwise.
- ``prompt`` is one text or one list of token ids; a batch of prompts is refused (send concurrent requests).
  A text prompt needs the checkpoint's ``tokenizer.json`` and is encoded as ``infinilm generate`` encodes it.
- ``max_tokens`` (chat: ``max_completion_tokens`` too) must be in ``[1, max_model_len - prompt tokens]``,
  as vLLM checks it; its default is 16 for completions (OpenAI's) and the rest of the context for chat.
- ``top_k``: 0 or -1 disable it (vLLM's -1, the engine's 0). ``seed``: ``[0, 2**64)``, the seeds of a
  `torch.Generator` that `SamplingParams` takes (torch would fold a negative seed onto that range).
- JSON ``null`` is the default of every optional field (the OpenAI API declares them nullable).
- The prompt is checked as the engine checks it, naming the request's field (``prompt``, or ``messages`` for
  chat): at least one token, every id in the model's vocabulary (a tokenizer may hold more ids than the
  config's ``vocab_size``), room to generate.
- ``stop``: one string or a list of at most 4 non-empty strings (OpenAI's limit) of at most 1024 characters each
  (a stop string is a marker; the limit bounds the text held back while it may still begin); it needs a tokenizer.
- A text prompt (completions' ``prompt``, chat's rendered ``messages``) of more than ``32 * max_model_len``
  characters is refused before it is encoded: no text that long fits (32 characters per token is several times
  what tokenizers reach on text, whitespace runs and code aside; the body limit allows the same), and encoding
  it would only cost time.
- JSON's non-standard ``NaN``/``Infinity`` literals are refused as invalid JSON, and so is a string holding a
  lone surrogate (JSON may escape one, ``"\\ud800"``; no UTF-8 text can hold it), naming where it is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from infinilm.engine.sequence import SamplingParams
from infinilm.serve.errors import APIError, bad_request

__all__ = ["GenerationRequest", "ModelInfo", "parse_body", "parse_chat", "parse_completion"]

_SEED_RANGE: Final = (0, 2**64 - 1)  # SamplingParams.seed's
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")  # a JSON escape of U+D800..U+DFFF
_MAX_STOP: Final = 4
_MAX_STOP_CHARS: Final = 1024
_PROMPT_CHARS_PER_TOKEN: Final = 32  # the prompt's characters allowed per token of max_model_len
_ROLES: Final = ("system", "developer", "user", "assistant", "tool")
# fields of the API the engine does not implement: accepted at these values only
_NEUTRAL: Final[Mapping[str, tuple[object, ...]]] = MappingProxyType({
    "n": (1,), "best_of": (1, None), "echo": (False,), "logprobs": (None, False), "top_logprobs": (None, 0),
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": (None, {}), "suffix": (None,),
    "parallel_tool_calls": (None,), "tools": (None, []), "tool_choice": (None, "none"),
})
_COMMON: Final = frozenset({"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                            "stop_token_ids", "ignore_eos", "stream", "stream_options", "return_token_ids",
                            "n", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "user"})
_COMPLETION_FIELDS: Final = _COMMON | {"prompt", "best_of", "echo", "suffix"}
_CHAT_FIELDS: Final = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "parallel_tool_calls",
                                 "tools", "tool_choice", "add_generation_prompt"}


@dataclass(frozen=True)
class ModelInfo:
    """What validation needs to know of the served model.

    Attributes:
        name: the model name clients send in ``model`` (``--served-model-name``, default the ``--model`` path).
        vocab_size: token ids must be in ``[0, vocab_size)``.
        max_model_len: longest prompt + output.
        cache_block_size / cache_blocks: the KV cache's block size and block count (for a recurrent model,
            the state pool's: one row holds a whole sequence), to refuse a prompt the cache can never hold.
        tokenizer: the `tokenizers.Tokenizer` of ``tokenizer.json``, or None (token-id prompts only).
        render_chat: renders validated messages to the prompt text (the checkpoint's chat template), or None
            when the checkpoint has no template. Raises `APIError` for messages the template refuses.
    """

    name: str
    vocab_size: int
    max_model_len: int
    cache_block_size: int
    cache_blocks: int
    tokenizer: Any | None = None
    render_chat: Callable[[list[dict[str, str]]], str] | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """One validated request.

    Attributes:
        prompt: the prompt's token ids.
        params: the engine's sampling parameters (``max_new_tokens`` is the request's ``max_tokens``).
        stop: stop strings: the output ends before the first one that appears (not included).
        stream: answer with server-sent events, one chunk per token.
        include_usage: streaming only: a last chunk carries ``usage`` (``stream_options.include_usage``).
        return_token_ids: each choice carries ``token_ids`` (and the response ``prompt_token_ids``).
    """

    prompt: list[int]
    params: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object.

    Raises:
        APIError: 400 (param ``body``): not UTF-8, not JSON (NaN and Infinity literals included), not an object;
            400 naming the field (``messages[0].content``; the object, for a key) of a string that holds a lone
            surrogate.
    """
    try:
        text = raw.decode("utf-8")
        body = json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise bad_request("body", "is not UTF-8 text") from None
    except (ValueError, RecursionError) as err:
        raise bad_request("body", f"is not valid JSON ({str(err)[:120]})") from None
    if not isinstance(body, dict):
        raise bad_request("body", f"must be a JSON object, got {type(body).__name__}")
    if _SURROGATE_ESCAPE.search(text):  # only an escape can make a surrogate: the raw text is valid UTF-8
        _check_unicode(body)
    return body


def _check_unicode(body: dict[str, Any]) -> None:
    """Refuse a string (a value or a key) of `body` that UTF-8 cannot encode, naming its field."""
    stack: list[tuple[str, object]] = [("body", body)]  # iterative: the body may nest as deep as JSON parses
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            _check_text(value, where, "")
        elif isinstance(value, list):  # only text can hold one: token ids and numbers are skipped
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value) if isinstance(v, (str, list, dict)))
        elif isinstance(value, dict):
            for key, v in value.items():
                _check_text(key, where, "a key ")
                stack.append((key if where == "body" else f"{where}.{key}", v))


def _check_text(text: str, where: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise bad_request(where, f"{what}holds a lone surrogate ({text[err.start]!a} at character {err.start}); "
                          "text must be Unicode characters (a surrogate pair escapes one above U+FFFF)") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_completion(body: dict[str, Any], info: ModelInfo) -> GenerationRequest:
    """Validate a ``/v1/completions`` body.

    Raises:
        APIError: 404 (``model``) for another model's name, 400 naming the field for anything else.
    """
    _check_fields(body, _COMPLETION_FIELDS)
    _check_model(body, info)
    prompt = _prompt(body, info)
    return _request(body, info, prompt, default_max_tokens=16)


def parse_chat(body: dict[str, Any], info: ModelInfo) -> GenerationRequest:
    """Validate a ``/v1/chat/completions`` body and render its messages with the chat template.

    Raises:
        APIError: 404 (``model``) for another model's name, 400 naming the field for anything else (``messages``
            when the checkpoint has no chat template or no tokenizer).
    """
    _check_fields(body, _CHAT_FIELDS)
    _check_model(body, info)
    messages = _messages(body)
    if info.render_chat is None or info.tokenizer is None:
        raise bad_request("messages", f"model {info.name!r} has no chat template (no chat_template in its "
                          "tokenizer_config.json, or no tokenizer.json); use /v1/completions")
    add_generation_prompt = _bool(body, "add_generation_prompt", True)
    if not add_generation_prompt:
        raise bad_request("add_generation_prompt", "only true is supported")
    text = info.render_chat(messages)
    _check_length(text, info, "messages", "the messages rendered by the chat template")
    prompt = info.tokenizer.encode(text, add_special_tokens=False).ids  # the template writes the special tokens
    _check_prompt(prompt, info, "messages", "the messages rendered by the chat template")
    if body.get("max_completion_tokens") is not None and body.get("max_tokens") is not None:
        raise bad_request("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _request(body, info, prompt, default_max_tokens=info.max_model_len - len(prompt), max_tokens_name=name)


def _check_fields(body: dict[str, Any], allowed: frozenset[str]) -> None:
    for name, value in body.items():
        if name not in allowed:
            raise bad_request(name, f"unknown field (accepted: {', '.join(sorted(allowed))})")
        if value is None:  # the field's default
            continue
        neutral = _NEUTRAL.get(name)
        if name == "user" and not isinstance(value, str):
            raise bad_request(name, f"must be a string, got {_show(value)}")
        if neutral is not None and not any(type(value) is type(v) and value == v for v in neutral):
            raise bad_request(name, f"{_show(value)} is not supported; only {' or '.join(map(_show, neutral))}")


def _check_model(body: dict[str, Any], info: ModelInfo) -> None:
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("model", f"must be the served model's name (a string), got {_show(model)}")
    if model != info.name:
        raise APIError(404, f"model: {_show(model)} is not served here; this server serves {info.name!r}", "model",
                       code="model_not_found")


def _prompt(body: dict[str, Any], info: ModelInfo) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt", "is empty")
        if info.tokenizer is None:
            raise bad_request("prompt", f"model {info.name!r} has no tokenizer.json: send token ids (a list of "
                              "integers)")
        _check_length(prompt, info, "prompt", "the prompt")
        ids = info.tokenizer.encode(prompt).ids
        _check_prompt(ids, info, "prompt", "the tokenizer's encoding of the prompt")
    elif isinstance(prompt, list):
        if prompt and all(isinstance(p, (str, list)) for p in prompt):
            raise bad_request("prompt", f"a batch of {len(prompt)} prompts; send one prompt per request")
        _check_prompt(_token_ids(prompt, "prompt", info.vocab_size), info, "prompt", "the prompt")
        ids = prompt
    else:
        raise bad_request("prompt", f"must be a string or a list of token ids, got {_show(prompt)}")
    return ids


def _token_ids(value: list[Any], name: str, vocab_size: int) -> list[int]:
    for i, t in enumerate(value):
        if type(t) is not int:
            raise bad_request(name, f"item {i} is {_show(t)}; token ids are integers")
        if not 0 <= t < vocab_size:
            raise bad_request(name, f"token id {t} (item {i}) is outside the vocabulary [0, {vocab_size})")
    return value


def _check_length(text: str, info: ModelInfo, name: str, what: str) -> None:
    """Refuse a prompt text too long to fit `info.max_model_len` before it is encoded (see the module's notes)."""
    limit = _PROMPT_CHARS_PER_TOKEN * info.max_model_len
    if len(text) > limit:
        raise bad_request(name, f"{what} has {len(text)} characters; at most {limit} ({_PROMPT_CHARS_PER_TOKEN} per "
                          f"token of max_model_len={info.max_model_len}) are encoded")


def _check_prompt(ids: list[int], info: ModelInfo, name: str, what: str) -> None:
    """The engine's checks of a prompt (`infinilm.engine.checks.check_prompt`, `Scheduler.add`), naming `name`."""
    if not ids:
        raise bad_request(name, f"{what} has no tokens")
    bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise bad_request(name, f"{what} holds token id {bad}, outside the model's vocabulary [0, {info.vocab_size})")
    if len(ids) >= info.max_model_len:
        raise bad_request(name, f"{len(ids)} prompt tokens leave no room to generate (max_model_len="
                          f"{info.max_model_len})")
    if -(-(len(ids) + 1) // info.cache_block_size) > info.cache_blocks:
        raise bad_request(name, f"{len(ids)} prompt tokens need more cache blocks than the server has "
                          f"({info.cache_blocks} of {info.cache_block_size} tokens)")


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", f"must be a non-empty list of messages, got {_show(messages)}")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(where, f"must be an object with role and content, got {_show(m)}")
        for key in m:
            if key not in ("role", "content", "name"):
                raise bad_request(f"{where}.{key}", "unknown field (accepted: role, content, name)")
        role = m.get("role")
        if role not in _ROLES:
            raise bad_request(f"{where}.role", f"{_show(role)} is not one of {', '.join(_ROLES)}")
        msg = {"role": role, "content": _content(m.get("content"), f"{where}.content", role)}
        if "name" in m:
            if not isinstance(m["name"], str):
                raise bad_request(f"{where}.name", f"must be a string, got {_show(m['name'])}")
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _content(content: Any, where: str, role: str) -> str:
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if isinstance(content, list) and content:
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                    and set(part) == {"type", "text"}):
                raise bad_request(f"{where}[{j}]", f"only text parts {{'type': 'text', 'text': str}} are supported, "
                                  f"got {_show(part)}")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(where, f"must be a string or a list of text parts, got {_show(content)}")


def _request(body: dict[str, Any], info: ModelInfo, prompt: list[int], *, default_max_tokens: int,
             max_tokens_name: str = "max_tokens") -> GenerationRequest:
    room = info.max_model_len - len(prompt)
    max_tokens = _int(body, max_tokens_name, min(default_max_tokens, room), 1, room,
                      why=f"the prompt has {len(prompt)} tokens and max_model_len is {info.max_model_len}")
    temperature = _float(body, "temperature", 1.0, 0.0, math.inf)
    top_p = _float(body, "top_p", 1.0, 0.0, 1.0, open_low=True)
    top_k = _int(body, "top_k", 0, -1, None)
    seed = body.get("seed")
    if seed is not None:
        seed = _int(body, "seed", 0, *_SEED_RANGE)
    stream = _bool(body, "stream", False)
    include_usage = False
    if body.get("stream_options") is not None:
        options = body["stream_options"]
        if not stream:
            raise bad_request("stream_options", "is only allowed with stream: true")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise bad_request("stream_options", f"must be {{'include_usage': bool}}, got {_show(options)}")
        include_usage = _bool(options, "include_usage", False, prefix="stream_options.")
    stop = _stop(body.get("stop"), info)
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and not isinstance(stop_ids, list):
        raise bad_request("stop_token_ids", f"must be a list of token ids, got {_show(stop_ids)}")
    try:
        params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_k=max(top_k, 0),
                                top_p=top_p, seed=seed, ignore_eos=_bool(body, "ignore_eos", False),
                                stop_token_ids=tuple(_token_ids(stop_ids or [], "stop_token_ids", info.vocab_size)))
    except ValueError as err:  # a range the checks above missed: still the client's value ("seed=-1 must be ...")
        field = str(err).split("=", 1)[0]
        raise bad_request(max_tokens_name if field == "max_new_tokens" else field, str(err)) from None
    return GenerationRequest(prompt, params, stop, stream, include_usage, _bool(body, "return_token_ids", False))


def _stop(stop: Any, info: ModelInfo) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad_request("stop", f"must be a non-empty string or a list of them, got {_show(stop)}")
    if len(items) > _MAX_STOP:
        raise bad_request("stop", f"{len(items)} stop strings; at most {_MAX_STOP}")
    longest = max((len(s) for s in items), default=0)
    if longest > _MAX_STOP_CHARS:
        raise bad_request("stop", f"a stop string of {longest} characters; at most {_MAX_STOP_CHARS}")
    if items and info.tokenizer is None:
        raise bad_request("stop", f"model {info.name!r} has no tokenizer.json to match text; use stop_token_ids")
    return tuple(items)


def _int(body: dict[str, Any], name: str, default: int, low: int, high: int | None, *, why: str = "") -> int:
    value = body.get(name)
    if value is None:
        return default
    if type(value) is not int:
        raise bad_request(name, f"{_show(value)} is not an integer")
    if value < low or (high is not None and value > high):
        span = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise bad_request(name, f"{value} is out of range; need {span}" + (f" ({why})" if why else ""))
    return value


def _float(body: dict[str, Any], name: str, default: float, low: float, high: float, *,
           open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if type(value) not in (int, float):
        raise bad_request(name, f"{_show(value)} is not a finite number")
    span = f"{'(' if open_low else '['}{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
    try:
        number = float(value)  # an int past float's range (JSON has no limit) overflows
    except OverflowError:
        raise bad_request(name, f"{_show(value)} is out of range; need {span}") from None
    if not math.isfinite(number):
        raise bad_request(name, f"{_show(value)} is not a finite number")
    if number < low or (open_low and number == low) or number > high:
        raise bad_request(name, f"{value} is out of range; need {span}")
    return number


def _bool(body: dict[str, Any], name: str, default: bool, *, prefix: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return default
    if type(value) is not bool:
        raise bad_request(prefix + name, f"{_show(value)} is not a boolean (true or false)")
    return value


def _show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
