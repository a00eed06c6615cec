"""Streaming text: `StreamDecoder` (incremental detokenization) and `TextOutput` (stop strings).

The streamed text must equal the whole output's decoding, whatever the tokens' boundaries (multi-byte
characters split across tokens, tokens that end inside a character, Llama's Metaspace and byte-fallback
decoders, whose text depends on the token before), and the work per token must not grow with the output:
counted as token ids handed to the tokenizer per push, never timed.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infinilm.demo import build_byte_tokenizer
from infinilm.serve.errors import APIError
from infinilm.serve.schemas import ModelInfo, parse_chat, parse_completion
from infinilm.serve.text import TextOutput
from infinilm.tokenizer import StreamDecoder


class ByteTokens:
    """Byte-level BPE's decoding: the tokens' bytes joined, decoded as UTF-8 with U+FFFD for what is not; counts
    the ids it decodes per call."""

    def __init__(self, tokens: list[bytes]) -> None:
        self.tokens, self.calls = tokens, []

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.calls.append(len(ids))
        return b"".join(self.tokens[i] for i in ids).decode("utf-8", errors="replace")


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at `cuts` (positions anywhere: inside characters too) into non-empty tokens."""
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


def _until_stop(out: TextOutput, n: int) -> str:
    """The text of tokens 0..n-1 pushed until a stop string is found, then the flush (as the server does)."""
    got = ""
    for i in range(n):
        got += out.push(i)
        if out.stopped:
            break
    return got + out.flush()


def _stream(decoder: StreamDecoder | TextOutput, ids: list[int]) -> list[str]:
    return [decoder.push(i) for i in ids] + [decoder.flush()]


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=1, max_size=60), cuts=st.lists(st.integers(0, 400), max_size=40))
def test_the_streamed_text_is_the_whole_decoding_for_tokens_cut_anywhere_in_utf8(text: str, cuts: list[int]) -> None:
    pieces = _split(text.encode(), cuts)
    tok = ByteTokens(pieces)
    out = _stream(StreamDecoder(tok), list(range(len(pieces))))
    assert "".join(out) == text
    assert all("\ufffd" not in piece for piece in out) or "\ufffd" in text  # partial characters held back


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=1, max_size=80), cuts=st.lists(st.integers(0, 400), max_size=15))
def test_bytes_that_are_not_utf8_stream_as_their_decoding(data: bytes, cuts: list[int]) -> None:
    pieces = _split(data, cuts)  # at most MAX_PENDING + 1 tokens: never cut before a character completes
    out = "".join(_stream(StreamDecoder(ByteTokens(pieces)), list(range(len(pieces)))))
    assert out == data.decode("utf-8", errors="replace")


def test_a_long_run_of_bytes_that_are_not_utf8_is_returned_as_it_decodes_with_bounded_work() -> None:
    tok = ByteTokens([b"\xff", b"A"])
    decoder = StreamDecoder(tok)
    out = [decoder.push(0) for _ in range(1000)] + [decoder.push(1), decoder.flush()]
    assert "".join(out) == "\ufffd" * 1000 + "A" and max(tok.calls) <= 2 * (StreamDecoder.MAX_PENDING + 1)
    assert out[StreamDecoder.MAX_PENDING] == "\ufffd" * (StreamDecoder.MAX_PENDING + 1)  # the run, once cut


def test_a_character_completed_by_its_last_byte_is_returned_with_it_and_not_before() -> None:
    euro = "\u20ac".encode()
    tok = ByteTokens([b"a", b"bc" + euro[:1], euro[1:2], euro[2:], b"d"])
    assert _stream(StreamDecoder(tok), [0, 1, 2, 3, 4]) == ["a", "bc", "", "\u20ac", "d", ""]
    assert _stream(StreamDecoder(tok), [0, 1, 2]) == ["a", "bc", "", "\ufffd"]  # ended inside the character


def test_decode_work_per_token_is_the_same_at_token_10_and_at_token_4000() -> None:
    rng = random.Random(0)
    words = [w.encode() for w in ("a", " b", "\u00e9", "\u20ac", "\U0001f600", " the", "\n")]
    pieces = _split(b"".join(rng.choice(words) for _ in range(3000)), [rng.randrange(1 << 16) for _ in range(6000)])
    tok = ByteTokens(pieces)
    out = TextOutput(tok, ("zzz", "\U0001f600\U0001f600\U0001f600!"))
    streamed = [out.push(i) for i in range(len(pieces))]
    streamed.append(out.flush())
    assert len(pieces) >= 4000
    assert "".join(streamed) == b"".join(pieces).decode()
    bound = 2 * (StreamDecoder.MAX_PENDING + 1)
    assert max(tok.calls) <= bound, max(tok.calls)  # ids decoded in one call: a window, never the output
    assert sum(tok.calls) <= 2 * bound * len(pieces)
    assert sum(tok.calls[-100:]) <= 2 * bound * 100  # the same at the end as on average


def test_without_holding_back_more_than_a_stop_strings_start_nothing_of_the_output_is_kept() -> None:
    tok = ByteTokens([b"x"])
    out = TextOutput(tok, ("x" * 50 + "y", "q"))
    returned = "".join(out.push(0) for _ in range(5000))
    assert len(returned) == 5000 - 50 and len(out._held) == 50  # the tail that may still begin the stop string
    assert out.flush() == "x" * 50 and not out.stopped


def _llama_like() -> object:
    """A Metaspace + byte-fallback tokenizer (Llama 2, Mistral): the decoding of a token depends on the one
    before (the leading space of the first token is stripped) and bytes come as ``<0xNN>`` tokens."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "\u2581a": 1, "\u2581b": 2, "c": 3, "\u2581": 4,
             **{f"<0x{b:02X}>": 5 + i for i, b in enumerate(sorted({*"\u20ac\U0001f600".encode()}))}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(1, 4), min_size=1, max_size=40), chars=st.lists(st.booleans(), max_size=40))
def test_a_metaspace_and_byte_fallback_tokenizer_streams_its_whole_decoding(ids: list[int], chars: list[bool]) -> None:
    tok = _llama_like()
    vocab = tok.get_vocab()
    seq: list[int] = []
    for i, (t, char) in enumerate(zip(ids, chars + [False] * len(ids), strict=False)):
        seq.append(t)
        if char:  # a whole multi-byte character as byte tokens
            seq.extend(vocab[f"<0x{b:02X}>"] for b in ("\u20ac" if i % 2 else "\U0001f600").encode())
    assert "".join(_stream(StreamDecoder(tok), seq)) == tok.decode(seq)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="ab\u20ac", min_size=1, max_size=40), stop=st.text(alphabet="ab\u20ac", min_size=1,
       max_size=5), cuts=st.lists(st.integers(0, 200), max_size=30))
def test_one_stop_string_ends_the_output_before_its_first_occurrence(text: str, stop: str, cuts: list[int]) -> None:
    pieces = _split(text.encode(), cuts)
    out = TextOutput(ByteTokens(pieces), (stop,))
    got = _until_stop(out, len(pieces))
    found = text.find(stop)
    assert got == (text if found < 0 else text[:found]) and out.stopped == (found >= 0)
    assert out.stop_string == (stop if found >= 0 else None)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="abc", min_size=1, max_size=40),
       stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=4),
       cuts=st.lists(st.integers(0, 200), max_size=30))
def test_several_stop_strings_cut_the_output_at_one_of_them(text: str, stops: list[str], cuts: list[int]) -> None:
    pieces = _split(text.encode(), cuts)
    out = TextOutput(ByteTokens(pieces), tuple(stops))
    got = _until_stop(out, len(pieces))
    assert text.startswith(got) and not any(s in got for s in stops)
    if out.stopped:
        assert out.stop_string in stops and text[len(got):].startswith(out.stop_string)
    else:
        assert out.stop_string is None
        assert got == text and not any(s in text for s in stops)


def test_the_stop_string_named_is_the_one_that_begins_first_then_the_first_listed() -> None:
    out = TextOutput(ByteTokens([b"x", b"abc", b"d"]), ("bc", "abc", "ab"))
    assert (out.push(0), out.push(1), out.stopped, out.stop_string) == ("x", "", True, "abc")
    out = TextOutput(ByteTokens([b"x", b"ab", b"c"]), ("abc", "b"))  # "b" is found; "abc" is not yet
    assert (out.push(0), out.push(1), out.stop_string, out.flush()) == ("x", "a", "b", "")


INFO = ModelInfo("m", 257, 256, 16, 64, build_byte_tokenizer(), None)


@pytest.mark.parametrize(("body", "param"), [
    ({"stop": "x" * 1025}, "stop"),
    ({"stop": ["a", "x" * 200_000]}, "stop"),
    ({"prompt": "x" * (32 * 256 + 1)}, "prompt"),
])
def test_stop_strings_and_prompts_past_their_length_limits_are_a_400_naming_the_field(
    body: dict[str, object], param: str
) -> None:
    with pytest.raises(APIError) as err:
        parse_completion({"model": "m", "prompt": "In", **body}, INFO)
    assert (err.value.status, err.value.param) == (400, param)
    assert "at most" in err.value.message


def test_a_prompt_past_the_character_limit_is_refused_before_it_is_encoded() -> None:
    class NoEncode:
        def encode(self, text: str, add_special_tokens: bool = True) -> object:
            raise AssertionError(f"encoded {len(text)} characters")

    with pytest.raises(APIError) as err:
        parse_completion({"model": "m", "prompt": "x" * 1_000_000}, ModelInfo("m", 257, 256, 16, 64, NoEncode(), None))
    assert err.value.param == "prompt" and "1000000 characters" in err.value.message
    ok = parse_completion({"model": "m", "prompt": "x" * 200, "stop": "y" * 1024}, INFO)
    assert len(ok.prompts[0]) == 200 and ok.stop == ("y" * 1024,)


def test_each_prompt_of_a_batch_and_the_rendered_chat_have_the_character_limit() -> None:
    with pytest.raises(APIError) as err:
        parse_completion({"model": "m", "prompt": ["In", "x" * (32 * 256 + 1)]}, INFO)
    assert (err.value.status, err.value.param) == (400, "prompt") and "prompt 1 of the batch" in err.value.message
    chat = dataclasses.replace(INFO, render_chat=lambda messages: "".join(m["content"] for m in messages))
    with pytest.raises(APIError) as err:
        parse_chat({"model": "m", "messages": [{"role": "user", "content": "x" * (32 * 256 + 1)}]}, chat)
    assert (err.value.status, err.value.param) == (400, "messages") and "8193 characters" in err.value.message
    assert parse_chat({"model": "m", "messages": [{"role": "user", "content": "x" * 200}]}, chat).prompts[0]
