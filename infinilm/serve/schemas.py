"""The request bodies of the OpenAI API (and vLLM's extensions) as pydantic models, validated into one
`GenerationRequest`.

pydantic (the library vLLM's and FastAPI's request models use) checks the types, ranges and unknown fields
of every body, strictly (``"5"`` is not an integer, ``1`` is not a boolean); `refusal` turns its first error
into a 400 whose ``param`` names the field (``messages[0].role``, ``stream_options.include_usage``) and
whose message says what is wrong and what was sent. What depends on the served model (the prompt's tokens,
``max_tokens`` against the context) is checked after, by hand, naming the field too. Decisions written
down here:

- An unknown field is refused (a misspelt ``max_token`` would otherwise be ignored without a word); it is
  reported before any other error. JSON ``null`` is the default of every optional field (the OpenAI API
  declares them nullable). Fields of the API the engine does not implement (``echo``, ``suffix``,
  ``logit_bias``, ``tools``, ...) are accepted at their neutral value only; ``response_format`` is accepted
  as ``{"type": "text"}`` and refused for ``json_object`` / ``json_schema`` (no guided decoding here).
- ``prompt``: one text, one list of token ids, or a batch (a list of texts or of token-id lists), vLLM's
  forms. A text needs the checkpoint's ``tokenizer.json`` and is encoded as ``infinilm generate`` encodes it.
- ``n`` choices per prompt, indexed ``prompt_index * n + j`` (vLLM's order); with a ``seed``, choice ``j``
  samples with ``seed + j`` (vLLM's child requests). ``best_of`` may only repeat ``n``.
- ``logprobs``: completions take the number of top tokens (``0`` to `MAX_LOGPROBS`), chat takes ``true``
  with ``top_logprobs`` (which needs ``logprobs: true``, as OpenAI and vLLM require).
- ``max_tokens`` (chat: ``max_completion_tokens`` too) must be in ``[1, max_model_len - prompt tokens]``,
  as vLLM checks it, for every prompt of a batch; its default is 16 for completions (OpenAI's) and the rest
  of the context for chat.
- ``top_k``: 0 or -1 disable it (vLLM's -1, the engine's 0). ``seed``: ``[0, 2**64)``, the seeds of a
  `torch.Generator` that `SamplingParams` takes (torch would fold a negative seed onto that range).
  ``min_p`` and the presence, frequency and repetition penalties go to `SamplingParams` (vLLM's meanings).
- The prompt is checked as the engine checks it, naming the request's field (``prompt``, or ``messages`` for
  chat): at least one token, every id in the model's vocabulary (a tokenizer may hold more ids than the
  config's ``vocab_size``), room to generate.
- ``stop``: one string or a list of at most 4 non-empty strings (OpenAI's limit) of at most 1024 characters each
  (a stop string is a marker; the limit bounds the text held back while it may still begin); it needs a tokenizer.
- A text prompt (each of completions' ``prompt`` texts, chat's rendered ``messages``) of more than
  ``32 * max_model_len`` characters is refused before it is encoded: no text that long fits (32 characters per
  token is several times what tokenizers reach on text, whitespace runs and code aside; the body limit allows
  the same), and encoding it would only cost time.
- JSON's non-standard ``NaN``/``Infinity`` literals are refused as invalid JSON, and so is a string holding a
  lone surrogate (JSON may escape one, ``"\\ud800"``; no UTF-8 text can hold it), naming where it is.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from infinilm.engine.sequence import MAX_LOGPROBS, SamplingParams
from infinilm.serve.errors import APIError, bad_request

__all__ = ["ChatCompletionRequest", "ChatMessage", "CompletionRequest", "DetokenizeRequest", "GenerationRequest",
           "ModelInfo", "TokenizeRequest", "check_model", "check_prompt", "parse_body", "parse_chat",
           "parse_completion", "refusal", "render_messages", "render_text", "show", "validate"]

_SEED_MAX: Final = 2**64 - 1  # SamplingParams.seed's range is [0, 2**64)
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")  # a JSON escape of U+D800..U+DFFF
_MAX_STOP: Final = 4
_MAX_STOP_CHARS: Final = 1024
_PROMPT_CHARS_PER_TOKEN: Final = 32  # the prompt's characters allowed per token of max_model_len
Role = Literal["system", "developer", "user", "assistant", "tool"]
# fields of the API the engine does not implement: accepted at these values only (None is every field's default)
_NEUTRAL: Final[Mapping[str, tuple[object, ...]]] = types.MappingProxyType({
    "echo": (False,), "logit_bias": ({},), "suffix": (), "parallel_tool_calls": (), "tools": ([],),
    "tool_choice": ("none",),
})
Model = typing.TypeVar("Model", bound=BaseModel)


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
        eos_token_ids: the model's EOS ids (a choice they end has ``stop_reason: null``, vLLM's).
    """

    name: str
    vocab_size: int
    max_model_len: int
    cache_block_size: int
    cache_blocks: int
    tokenizer: Any | None = None
    render_chat: Callable[[list[dict[str, str]]], str] | None = None
    eos_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One validated request: its prompts, and what each of their `n` choices samples with.

    Attributes:
        prompts: each prompt's token ids (one, or a batch).
        params: per prompt, the engine's sampling parameters (``max_new_tokens`` is the request's ``max_tokens``).
        n: choices per prompt.
        stop: stop strings: the output ends before the first one that appears (not included).
        stream: answer with server-sent events, one chunk per token.
        include_usage: streaming only: a last chunk carries ``usage`` (``stream_options.include_usage``).
        return_token_ids: each choice carries ``token_ids`` (and the response ``prompt_token_ids``).
        logprobs: how many top tokens each token's logprobs list (0: the token's own only), or None: no logprobs.
    """

    prompts: tuple[list[int], ...]
    params: tuple[SamplingParams, ...]
    n: int = 1
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    logprobs: int | None = None

    def choices(self) -> list[tuple[int, int, SamplingParams]]:
        """``(index, prompt index, params)`` of every choice: index ``prompt * n + j``, seed ``seed + j``."""
        out = []
        for p, params in enumerate(self.params):
            for j in range(self.n):
                seed = None if params.seed is None else (params.seed + j) % (_SEED_MAX + 1)
                out.append((p * self.n + j, p, dataclasses.replace(params, seed=seed) if j else params))
        return out


# -- the request models --------------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def _neutral(cls: type, value: object, info: ValidationInfo) -> object:
    allowed = _NEUTRAL[info.field_name or ""]
    if value is not None and not any(type(value) is type(v) and value == v for v in allowed):
        accepted = " or ".join(map(show, (None, *allowed)))
        raise ValueError(f"{show(value)} is not supported (the engine does not implement it); only {accepted}")
    return value


class StreamOptions(_Body):
    include_usage: bool | None = None


class ResponseFormat(_Body):
    """``{"type": "text"}`` is served; ``json_object`` / ``json_schema`` parse, to be refused by name."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _Sampling(_Body):
    """The fields completions and chat share (OpenAI's, plus vLLM's sampling extensions)."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, le=_SEED_MAX)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    ignore_eos: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    _neutral_fields = field_validator("logit_bias")(_neutral)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: object) -> object:
        items = [value] if isinstance(value, str) else value
        if value is not None and not (isinstance(items, list) and all(isinstance(s, str) and s for s in items)):
            raise ValueError(f"must be a non-empty string or a list of them, got {show(value)}")
        if isinstance(items, list) and len(items) > _MAX_STOP:
            raise ValueError(f"{len(items)} stop strings; at most {_MAX_STOP}")
        longest = max((len(s) for s in items), default=0) if isinstance(items, list) else 0
        if longest > _MAX_STOP_CHARS:
            raise ValueError(f"a stop string of {longest} characters; at most {_MAX_STOP_CHARS}")
        return value


def _check_prompt_shape(value: object) -> object:
    if isinstance(value, str):
        if not value:
            raise ValueError("is empty")
        return value
    if not isinstance(value, list):
        raise ValueError(f"must be a string, a list of token ids, or a batch of them, got {show(value)}")
    if not value:
        raise ValueError("is empty (no token ids)")
    if all(isinstance(p, (str, list)) for p in value):  # a batch
        for i, p in enumerate(value):
            if not p:
                raise ValueError(f"prompt {i} of the batch is empty")
            if isinstance(p, list):
                _ints(p, f"prompt {i} of the batch: ")
        if len({type(p) for p in value}) > 1:
            raise ValueError("a batch is a list of strings or a list of token-id lists, not both")
        return value
    _ints(value, "")
    return value


def _ints(ids: list[Any], where: str) -> None:
    bad = next((i for i, t in enumerate(ids) if type(t) is not int), None)
    if bad is not None:
        raise ValueError(f"{where}item {bad} is {show(ids[bad])}; token ids are integers")


class CompletionRequest(_Sampling):
    """A ``/v1/completions`` body."""

    prompt: Annotated[str | list[int] | list[str] | list[list[int]], Field(union_mode="left_to_right")]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1)
    echo: bool | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: object) -> object:
        return _check_prompt_shape(value)

    _neutral_fields = field_validator("logit_bias", "echo", "suffix")(_neutral)


class TextPart(_Body):
    """A ``{"type": "text", "text": ...}`` part of a message's content (the only kind served)."""

    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _only_text(cls, value: object) -> object:
        if not (isinstance(value, dict) and value.get("type") == "text" and isinstance(value.get("text"), str)
                and set(value) == {"type", "text"}):
            raise ValueError(f"only text parts {{'type': 'text', 'text': str}} are supported, got {show(value)}")
        return value


class ChatMessage(_Body):
    role: Role
    content: str | Annotated[list[TextPart], Field(min_length=1)] | None = Field(None, validate_default=True)
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content_needed(cls, value: object, info: ValidationInfo) -> object:
        if value is None and info.data.get("role") != "assistant":
            raise ValueError("must be a string or a list of text parts (only an assistant's may be null)")
        return value

    def text(self) -> dict[str, str]:
        """The message as the chat template takes it: role, content text, and name if given."""
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or ())
        return {"role": self.role, "content": content} | ({"name": self.name} if self.name is not None else {})


class ChatCompletionRequest(_Sampling):
    """A ``/v1/chat/completions`` body."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    add_generation_prompt: bool | None = None

    _neutral_fields = field_validator("logit_bias", "tools", "tool_choice", "parallel_tool_calls")(_neutral)


class TokenizeRequest(_Body):
    """A vLLM ``/tokenize`` body: a ``prompt`` text or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(_Body):
    """A vLLM ``/detokenize`` body."""

    model: str | None = None
    tokens: list[int]


# -- pydantic's errors as the API's ---------------------------------------------------------------------
def validate(cls: type[Model], body: dict[str, Any]) -> Model:
    """`body` as a `cls`.

    Raises:
        APIError: 400 naming the field of the first error (an unknown field first).
    """
    try:
        return cls.model_validate(body)
    except ValidationError as err:
        raise refusal(err, cls) from None


def refusal(err: ValidationError, cls: type[BaseModel]) -> APIError:
    """The 400 answering pydantic's `err` of `cls`: ``param`` is the first error's field, in the API's notation
    (``messages[0].content[1]``), the message pydantic's (the failures of a union's members joined) and what
    was sent."""
    errors = sorted(err.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")  # stable
    # of the first field's errors, the deepest: the union member that got furthest (a list's bad item)
    first = max((e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]), key=lambda e: len(e["loc"]))
    param = _param(first["loc"], cls, first["type"] == "extra_forbidden")
    if first["type"] == "extra_forbidden":
        accepted = _fields_at(cls, first["loc"][:-1])
        return bad_request(param, "unknown field" + (f" (accepted: {', '.join(accepted)})" if accepted else ""))
    said = list(dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in errors if _param(e["loc"], cls) == param))
    message = "; or ".join(said)
    if first["type"] not in ("value_error", "missing") and not isinstance(first["input"], dict):
        message += f" (got {show(first['input'])})"
    return bad_request(param, message)


def _param(loc: tuple[int | str, ...], cls: type[BaseModel], extra: bool = False) -> str:
    """A pydantic location as the API names a field, without pydantic's tags of a union's members (an unknown
    field, `extra`, is the last part)."""
    names = _field_names(cls)
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in names or (extra and i == len(loc) - 1):
            out += f".{part}" if out else part
    return out or "body"


@functools.cache
def _field_names(cls: type[BaseModel]) -> frozenset[str]:
    names: set[str] = set()
    for model in _models(cls):
        names |= set(model.model_fields)
    return frozenset(names)


def _models(cls: type[BaseModel]) -> list[type[BaseModel]]:
    """`cls` and every model its fields hold (through lists and unions)."""
    out, stack = [], [cls]
    while stack:
        model = stack.pop()
        if model not in out:
            out.append(model)
            stack.extend(m for f in model.model_fields.values() for m in _inner(f.annotation))
    return out


def _inner(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _inner(arg)]


def _fields_at(cls: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The accepted fields of the model at `loc` (the object an unknown field was found in)."""
    model: type[BaseModel] | None = cls
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) and model is not None else None
        if field is not None:  # not an index, not a union's tag
            inner = _inner(field.annotation)
            model = inner[0] if inner else None
    return sorted(model.model_fields) if model is not None else []


# -- the bodies of /v1/completions and /v1/chat/completions ---------------------------------------------------
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


def check_model(model: object, info: ModelInfo) -> None:
    """Refuse another model's name with OpenAI's 404 ``model_not_found`` (a non-string is left to validation)."""
    if isinstance(model, str) and model != info.name:
        raise APIError(404, f"model: {show(model)} is not served here; this server serves {info.name!r}", "model",
                       code="model_not_found")


def parse_completion(body: dict[str, Any], info: ModelInfo) -> GenerationRequest:
    """Validate a ``/v1/completions`` body.

    Raises:
        APIError: 404 (``model``) for another model's name, 400 naming the field for anything else.
    """
    check_model(body.get("model"), info)
    req = validate(CompletionRequest, body)
    prompts = _prompts(req.prompt, info)
    return _request(req, info, prompts, [min(16, info.max_model_len - len(p)) for p in prompts], "max_tokens",
                    req.max_tokens, req.logprobs)


def parse_chat(body: dict[str, Any], info: ModelInfo) -> GenerationRequest:
    """Validate a ``/v1/chat/completions`` body and render its messages with the chat template.

    Raises:
        APIError: 404 (``model``) for another model's name, 400 naming the field for anything else (``messages``
            when the checkpoint has no chat template or no tokenizer).
    """
    check_model(body.get("model"), info)
    req = validate(ChatCompletionRequest, body)
    if req.add_generation_prompt is False:
        raise bad_request("add_generation_prompt", "only true is supported")
    prompt = render_messages(req.messages, info)
    if req.max_completion_tokens is not None and req.max_tokens is not None:
        raise bad_request("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs", f"{req.top_logprobs} needs logprobs: true")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    max_tokens = req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens
    return _request(req, info, [prompt], [info.max_model_len - len(prompt)], name, max_tokens, logprobs)


def render_messages(messages: list[ChatMessage], info: ModelInfo) -> list[int]:
    """The token ids of `messages` rendered by the chat template (which writes the special tokens).

    Raises:
        APIError: 400 (``messages``): no chat template or tokenizer, the template refuses them, or the ids are
            not a prompt the engine can run.
    """
    text = render_text(messages, info)  # first: it refuses a model without a tokenizer
    _check_length(text, info, "messages", "the messages rendered by the chat template")
    prompt = info.tokenizer.encode(text, add_special_tokens=False).ids  # type: ignore[union-attr]
    check_prompt(prompt, info, "messages", "the messages rendered by the chat template")
    return prompt


def render_text(messages: list[ChatMessage], info: ModelInfo) -> str:
    """`messages` rendered by the chat template, as text.

    Raises:
        APIError: 400 (``messages``): no chat template or tokenizer, or the template refuses them.
    """
    if info.render_chat is None or info.tokenizer is None:
        raise bad_request("messages", f"model {info.name!r} has no chat template (no chat_template in its "
                          "tokenizer_config.json, or no tokenizer.json); use /v1/completions")
    return info.render_chat([m.text() for m in messages])


def _prompts(prompt: str | list[int] | list[str] | list[list[int]], info: ModelInfo) -> list[list[int]]:
    batch = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
    out = []
    for i, p in enumerate(batch):
        what = "the prompt" if len(batch) == 1 else f"prompt {i} of the batch"
        if isinstance(p, str):
            if info.tokenizer is None:
                raise bad_request("prompt", f"model {info.name!r} has no tokenizer.json: send token ids (a list "
                                  "of integers)")
            _check_length(p, info, "prompt", what)
            ids = info.tokenizer.encode(p).ids
            what = f"the tokenizer's encoding of {what}"
        else:
            ids = p
        check_prompt(ids, info, "prompt", what)
        out.append(ids)
    return out


def _check_length(text: str, info: ModelInfo, name: str, what: str) -> None:
    """Refuse a prompt text too long to fit `info.max_model_len` before it is encoded (see the module's notes).

    Raises:
        APIError: 400 naming `name`: more than ``32 * max_model_len`` characters.
    """
    limit = _PROMPT_CHARS_PER_TOKEN * info.max_model_len
    if len(text) > limit:
        raise bad_request(name, f"{what} has {len(text)} characters; at most {limit} ({_PROMPT_CHARS_PER_TOKEN} per "
                          f"token of max_model_len={info.max_model_len}) are encoded")


def check_prompt(ids: list[int], info: ModelInfo, name: str, what: str) -> None:
    """The engine's checks of a prompt (`infinilm.engine.checks.check_prompt`, `Scheduler.add`), naming `name`.

    Raises:
        APIError: 400 naming `name`: no tokens, an id outside the vocabulary, no room to generate, more cache
            blocks than the server has.
    """
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


def _request(req: CompletionRequest | ChatCompletionRequest, info: ModelInfo, prompts: list[list[int]],
             default_max_tokens: list[int], max_tokens_name: str, max_tokens: int | None,
             logprobs: int | None) -> GenerationRequest:
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request("response_format", f"type {req.response_format.type!r} is not served (this server has "
                          "no guided decoding); only {\"type\": \"text\"}")
    n = req.n or 1
    if req.best_of is not None and req.best_of != n:
        raise bad_request("best_of", f"{req.best_of} is not supported; only best_of == n ({n}), or null")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options", "is only allowed with stream: true")
    stop = () if req.stop is None else (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)
    if stop and info.tokenizer is None:
        raise bad_request("stop", f"model {info.name!r} has no tokenizer.json to match text; use stop_token_ids")
    stop_ids = tuple(req.stop_token_ids or ())
    bad = next((t for t in stop_ids if t >= info.vocab_size), None)
    if bad is not None:
        raise bad_request("stop_token_ids", f"token id {bad} is outside the vocabulary [0, {info.vocab_size})")
    params = []
    for prompt, default in zip(prompts, default_max_tokens):
        room = info.max_model_len - len(prompt)
        if max_tokens is not None and max_tokens > room:
            raise bad_request(max_tokens_name, f"{max_tokens} is out of range; need [1, {room}] (the prompt has "
                              f"{len(prompt)} tokens and max_model_len is {info.max_model_len})")
        try:
            params.append(SamplingParams(
                max_new_tokens=default if max_tokens is None else max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_k=max(req.top_k or 0, 0), top_p=1.0 if req.top_p is None else req.top_p, seed=req.seed,
                ignore_eos=bool(req.ignore_eos), stop_token_ids=stop_ids, min_p=req.min_p or 0.0,
                presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
                repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                logprobs=logprobs))
        except ValueError as err:  # a range the model missed: still the client's value ("seed=-1 must be ...")
            field = str(err).split("=", 1)[0]
            raise bad_request(max_tokens_name if field == "max_new_tokens" else field, str(err)) from None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return GenerationRequest(tuple(prompts), tuple(params), n, stop, bool(req.stream), include_usage,
                             bool(req.return_token_ids), logprobs)


def show(value: object) -> str:
    """`value` as JSON (or its repr), cut to 60 characters, for an error message."""
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

