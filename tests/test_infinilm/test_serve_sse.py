"""`infinilm.serve.sse.TokenFrames`: the same bytes as the pydantic models' frames, for any text and fields."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from infinilm.serve.responses import ChatChunk, ChatChunkChoice, ChatDelta, CompletionChoice, CompletionResponse
from infinilm.serve.sse import TokenFrames, frame

texts = st.text(max_size=40)  # any code point but surrogates: quotes, backslashes, controls, non-ASCII, emoji
fields = st.fixed_dictionaries({
    "index": st.integers(0, 1000), "text": texts, "finish_reason": st.sampled_from([None, "stop", "length", "abort"]),
    "stop_reason": st.one_of(st.none(), st.integers(0, 200000), texts),
    "token_ids": st.one_of(st.none(), st.lists(st.integers(0, 200000), max_size=2)),
})


@settings(max_examples=300, deadline=None)
@given(fields=fields, id=texts, model=texts, created=st.integers(0, 2**40))
def test_completion_frame_is_the_models(fields: dict, id: str, model: str, created: int) -> None:
    want = CompletionResponse(id=id, created=created, model=model, choices=[CompletionChoice(
        index=fields["index"], text=fields["text"], logprobs=None, finish_reason=fields["finish_reason"],
        stop_reason=fields["stop_reason"], token_ids=fields["token_ids"])])
    got = TokenFrames(id, created, model, chat=False).token(**fields)
    assert got == frame(want.model_dump_json())


@settings(max_examples=300, deadline=None)
@given(fields=fields, id=texts, model=texts, created=st.integers(0, 2**40))
def test_chat_frame_is_the_models(fields: dict, id: str, model: str, created: int) -> None:
    want = ChatChunk(id=id, created=created, model=model, choices=[ChatChunkChoice(
        index=fields["index"], delta=ChatDelta(content=fields["text"]), logprobs=None,
        finish_reason=fields["finish_reason"], stop_reason=fields["stop_reason"], token_ids=fields["token_ids"])])
    got = TokenFrames(id, created, model, chat=True).token(**fields)
    assert got == frame(want.model_dump_json())
