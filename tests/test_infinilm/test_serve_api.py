"""The OpenAI surface vLLM users rely on, through the `openai` client against ``infinilm serve`` on 127.0.0.1:
batched prompts, ``n``, logprobs (checked against ``log_softmax`` of the model's own logits, computed here by
the Hugging Face model of the same checkpoint in float64), penalties and ``min_p`` (the engine's tokens),
``stop_reason``, ``response_format``, ``/v1/models/{id}``, ``/tokenize``, ``/detokenize``, ``/version``, the API
key (``INFINILM_API_KEY``) and the access log.

One server for the module (the demo Qwen3, its byte-level tokenizer and the chat template of `test_serve`),
stopped by SIGTERM at the end, exit 0. Greedy requests and the engine's own greedy output are compared token
for token; sampled ones only against the same seed.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from test_serve import DENSE, MAX_LEN, TEMPLATE, Server

from infinilm import Engine, EngineOptions, SamplingParams
from infinilm.demo import PROMPT, TEXT, demo_checkpoint
from infinilm.serve.commands import add_serve_args
from infinilm.tokenizer import load_tokenizer
from infiniops_py import __version__

openai = pytest.importorskip("openai")

KEY = "sk-test-key"
GREEDY = TEXT.removeprefix(PROMPT)
LOGPROB_ATOL = 1e-4  # the engine's float32 logits against the float64 reference: 2 layers, 257 logits


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = demo_checkpoint(tmp_path_factory.mktemp("api-demo"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE,
                                                            "eos_token": "<|endoftext|>"}))
    return path


@pytest.fixture(scope="module")
def server(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(demo, *DENSE, log=tmp_path_factory.mktemp("logs") / "api.err", env={"INFINILM_API_KEY": KEY})
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log.read_text()


def _client(server: Server, key: str = KEY) -> object:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(demo: Path) -> object:
    """The checkpoint's Hugging Face model in float64: ``log_softmax`` of its logits is the expected logprobs."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(demo), torch_dtype=torch.float64).eval()


def _reference_logprobs(model: object, prompt: list[int], output: list[int]) -> torch.Tensor:
    """``[len(output), V]``: the log-probabilities of every next token at each output position."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: len(prompt) + len(output) - 1]  # type: ignore[operator]
    return torch.log_softmax(logits.double(), dim=-1)


def _check_top(got: dict[int, float], row: torch.Tensor, k: int) -> None:
    """`got` holds `k` tokens: each logprob is the reference's, and none is less likely than a token left out
    (up to the tolerance: a near tie may go either way)."""
    assert len(got) == k, got
    for token, lp in got.items():
        assert lp == pytest.approx(float(row[token]), abs=LOGPROB_ATOL), (token, lp, float(row[token]))
    kth = float(row.topk(k).values[-1])
    assert min(float(row[t]) for t in got) >= kth - LOGPROB_ATOL


def test_completion_logprobs_are_the_log_softmax_of_the_models_logits(server: Server, reference: object,
                                                                      demo: Path) -> None:
    tokenizer = load_tokenizer(demo)
    text_of = {i: tokenizer.decode([i], skip_special_tokens=False) for i in range(257)}
    by_text = {}
    for i, t in text_of.items():
        by_text.setdefault(t, i)
    out = _client(server).completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3,
                                             extra_body={"return_token_ids": True})
    choice = out.choices[0]
    ids, lp = choice.token_ids, choice.logprobs
    assert choice.text == GREEDY[:12] and len(ids) == 12
    assert lp.tokens == [text_of[t] for t in ids]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(12)]
    rows = _reference_logprobs(reference, list(PROMPT.encode()), ids)
    for i, token in enumerate(ids):
        assert lp.token_logprobs[i] == pytest.approx(float(rows[i, token]), abs=LOGPROB_ATOL)
        top = {by_text[t]: v for t, v in lp.top_logprobs[i].items()}
        assert top[token] == pytest.approx(lp.token_logprobs[i])  # the sampled token is always there (OpenAI's)
        _check_top(top, rows[i], 3)  # greedy: the sampled token is one of the top 3, so 3 entries in all
    # streamed: one token per chunk, offsets running over the chunks
    chunks = list(_client(server).completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0,
                                                     logprobs=0, stream=True))
    assert [c.choices[0].logprobs.tokens[0] for c in chunks] == lp.tokens
    assert [c.choices[0].logprobs.text_offset[0] for c in chunks] == lp.text_offset
    assert [c.choices[0].logprobs.token_logprobs[0] for c in chunks] == pytest.approx(lp.token_logprobs, abs=1e-6)
    assert all(len(c.choices[0].logprobs.top_logprobs[0]) == 1 for c in chunks)  # logprobs=0: the token only


def test_chat_logprobs_list_the_top_tokens_with_their_bytes(server: Server, reference: object, demo: Path) -> None:
    tokenizer = load_tokenizer(demo)
    by_text = {tokenizer.decode([i], skip_special_tokens=False): i for i in range(257)}
    messages = [{"role": "user", "content": PROMPT}]
    out = _client(server).chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0,
                                                  logprobs=True, top_logprobs=4)
    content = out.choices[0].logprobs.content
    assert "".join(e.token for e in content) == out.choices[0].message.content == GREEDY[:8]
    ids = [by_text[e.token] for e in content]
    rows = _reference_logprobs(reference, list(PROMPT.encode()), ids)
    for i, entry in enumerate(content):
        assert entry.bytes == list(entry.token.encode())
        assert entry.logprob == pytest.approx(float(rows[i, ids[i]]), abs=LOGPROB_ATOL)
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs),
                                                                  reverse=True)
        _check_top({by_text[t.token]: t.logprob for t in entry.top_logprobs}, rows[i], 4)
    plain = _client(server).chat.completions.create(model="m", messages=messages, max_tokens=3, temperature=0,
                                                    logprobs=True)
    assert [e.top_logprobs for e in plain.choices[0].logprobs.content] == [[], [], []]
    assert _client(server).chat.completions.create(model="m", messages=messages, max_tokens=3).choices[0].logprobs \
        is None
    stream = list(_client(server).chat.completions.create(model="m", messages=messages, max_tokens=4, temperature=0,
                                                          logprobs=True, top_logprobs=2, stream=True))
    entries = [e for c in stream[1:] for e in c.choices[0].logprobs.content]
    assert [e.token for e in entries] == [e.token for e in content[:4]]
    assert [len(e.top_logprobs) for e in entries] == [2] * 4


def test_batched_prompts_and_n_choices_are_indexed_prompt_times_n_plus_j(server: Server) -> None:
    client = _client(server)
    out = client.completions.create(model="m", prompt=[PROMPT, "InfiniOps-Py runs"], n=2, max_tokens=6,
                                    temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    after = TEXT.removeprefix("InfiniOps-Py runs")
    assert [c.text for c in out.choices] == [GREEDY[:6]] * 2 + [after[:6]] * 2
    assert out.usage.prompt_tokens == len(PROMPT) + len("InfiniOps-Py runs")  # each prompt once
    assert out.usage.completion_tokens == 4 * 6
    ids = client.completions.create(model="m", prompt=[list(PROMPT.encode()), [73, 110]], max_tokens=3,
                                    temperature=0)
    assert ids.choices[0].text == GREEDY[:3] and len(ids.choices) == 2
    # streamed: each index's chunks, in order, are that choice's answer; one finish per index
    chunks = list(client.completions.create(model="m", prompt=[PROMPT, "InfiniOps-Py runs"], n=2, max_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    *tokens, usage = chunks
    texts: dict[int, str] = {}
    finishes: dict[int, list[str]] = {}
    for c in tokens:
        (choice,) = c.choices
        texts[choice.index] = texts.get(choice.index, "") + choice.text
        if choice.finish_reason is not None:
            finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert texts == {c.index: c.text for c in out.choices}
    assert finishes == {i: ["length"] for i in range(4)} and len(tokens) == 4 * 6
    assert usage.usage.completion_tokens == 24 and usage.usage.prompt_tokens == out.usage.prompt_tokens
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}], n=3,
                                          max_tokens=5, temperature=0)
    assert [(c.index, c.message.content) for c in chat.choices] == [(i, GREEDY[:5]) for i in range(3)]
    stream = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}], n=2,
                                                 max_tokens=5, temperature=0, stream=True))
    assert [(c.choices[0].index, c.choices[0].delta.role) for c in stream[:2]] == [(0, "assistant"), (1, "assistant")]
    for i in range(2):
        assert "".join(c.choices[0].delta.content for c in stream[2:] if c.choices[0].index == i) == GREEDY[:5]


def test_n_choices_sample_with_seed_plus_their_index(server: Server) -> None:
    client = _client(server)
    prompt = [5, 200, 17, 99]  # no sentence the demo model knows: sampling at temperature 3 spreads
    body = {"model": "m", "prompt": prompt, "max_tokens": 8, "temperature": 3.0,
            "extra_body": {"ignore_eos": True, "return_token_ids": True}}
    many = client.completions.create(**body, n=3, seed=41)
    solo = [client.completions.create(**body, seed=41 + j).choices[0].token_ids for j in range(3)]
    assert [c.token_ids for c in many.choices] == solo
    assert len({tuple(s) for s in solo}) == 3  # three seeds, three different samples


def _engine(demo: Path) -> Engine:
    return Engine.from_pretrained(demo, EngineOptions(max_model_len=MAX_LEN, block_size=16, num_blocks=64))


def test_penalties_and_min_p_reach_the_engine(server: Server, demo: Path) -> None:
    client = _client(server)
    prompt = [5, 200, 17, 99]  # no sentence the demo model knows: its greedy output repeats, penalties change it
    cases = [dict(repetition_penalty=1.8), dict(presence_penalty=1.5, frequency_penalty=1.0),
             dict(min_p=0.2, temperature=2.0, seed=3)]
    engine = _engine(demo)
    plain = engine.generate([prompt], SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=0.0))[0]
    for fields in cases:
        params = {"temperature": 0.0, **fields}
        want = engine.generate([prompt], SamplingParams(max_new_tokens=40, ignore_eos=True, **params))[0]
        known = {k: v for k, v in params.items() if k in ("temperature", "seed", "presence_penalty",
                                                         "frequency_penalty")}  # the openai client's own
        extra = {k: v for k, v in params.items() if k not in known}  # vLLM's: repetition_penalty, min_p
        got = client.completions.create(model="m", prompt=prompt, max_tokens=40, **known,
                                        extra_body={"ignore_eos": True, "return_token_ids": True, **extra})
        assert got.choices[0].token_ids == want, fields
        if "seed" not in fields:
            assert want != plain, fields  # the penalty changed the greedy output: the test can see it


def test_stop_reason_names_the_stop_string_or_token_and_is_null_otherwise(server: Server) -> None:
    client = _client(server)
    by_string = client.completions.create(model="m", prompt=PROMPT, max_tokens=60, temperature=0,
                                          stop=["xyz", "runs"])
    assert by_string.choices[0].text == "-Py " and by_string.choices[0].model_extra["stop_reason"] == "runs"
    by_token = client.completions.create(model="m", prompt=PROMPT, max_tokens=60, temperature=0,
                                         extra_body={"stop_token_ids": [32]})
    assert by_token.choices[0].text == "-Py " and by_token.choices[0].model_extra["stop_reason"] == 32
    eos = client.completions.create(model="m", prompt=PROMPT, max_tokens=200, temperature=0)
    assert eos.choices[0].finish_reason == "stop" and eos.choices[0].model_extra["stop_reason"] is None
    length = client.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0)
    assert length.choices[0].finish_reason == "length" and length.choices[0].model_extra["stop_reason"] is None
    chat = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}],
                                               max_tokens=60, temperature=0, stop="this", stream=True))
    assert chat[-1].choices[0].finish_reason == "stop" and chat[-1].choices[0].model_extra["stop_reason"] == "this"


def test_response_format_text_is_served_and_json_is_refused_by_name(server: Server) -> None:
    client = _client(server)
    messages = [{"role": "user", "content": PROMPT}]
    ok = client.chat.completions.create(model="m", messages=messages, max_tokens=3, temperature=0,
                                        response_format={"type": "text"})
    assert ok.choices[0].message.content == GREEDY[:3]
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="m", messages=messages, max_tokens=3, response_format=fmt)
        assert err.value.body["param"] == "response_format" and "not served" in err.value.body["message"]


def test_models_tokenize_detokenize_and_version(server: Server, demo: Path) -> None:
    client = _client(server)
    card = client.models.retrieve("m")
    assert (card.id, card.object, card.model_extra["max_model_len"]) == ("m", "model", MAX_LEN)
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("other/model")
    assert err.value.body["code"] == "model_not_found"
    ids = load_tokenizer(demo).encode(PROMPT).ids
    with httpx.Client(base_url=server.url, timeout=30) as http:
        tok = http.post("/tokenize", json={"model": "m", "prompt": PROMPT}).json()
        assert tok == {"count": len(ids), "max_model_len": MAX_LEN, "tokens": ids, "token_strs": None}
        strs = http.post("/tokenize", json={"prompt": PROMPT, "return_token_strs": True}).json()["token_strs"]
        assert strs == list(PROMPT)  # the byte tokens of ASCII text are its characters
        chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": PROMPT}]}).json()
        assert chat["tokens"] == ids  # TEMPLATE renders the user's text alone
        assert http.post("/detokenize", json={"tokens": ids}).json() == {"prompt": PROMPT}
        assert http.get("/version").json() == {"version": __version__}
        for path, body, param in (("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": 5}, "prompt"),
                                  ("/detokenize", {"tokens": [999]}, "tokens"), ("/detokenize", {}, "tokens"),
                                  ("/tokenize", {"prompt": "x", "model": "other"}, "model")):
            resp = http.post(path, json=body)
            assert resp.status_code in (400, 404) and resp.json()["error"]["param"] == param, (path, body, resp.text)


def test_the_v1_routes_need_the_api_key(server: Server) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        _client(server, "sk-wrong").completions.create(model="m", prompt=PROMPT, max_tokens=2)
    assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for headers in ({}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"},
                        {"Authorization": f"Bearer {KEY}x"}):
            resp = http.get("/v1/models", headers=headers)
            assert resp.status_code == 401 and resp.headers["WWW-Authenticate"] == "Bearer", headers
            assert resp.json()["error"]["type"] == "invalid_request_error"
        ok = http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "m"
        assert http.get("/health").status_code == 200  # open, as vLLM's are
        assert http.get("/version").status_code == 200
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    assert parser.parse_args(["--api-key", "k2"]).api_key == "k2" and parser.parse_args([]).api_key is None


def test_every_request_gets_an_access_log_line(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        http.get("/v1/models/m", headers={"Authorization": f"Bearer {KEY}"})
        http.get("/v1/models/m")
        http.post("/nothing/here")
    wanted = [r'"GET /v1/models/m HTTP/1\.1" 200 [\d.]+ms', r'"GET /v1/models/m HTTP/1\.1" 401 [\d.]+ms',
              r'"POST /nothing/here HTTP/1\.1" 404 [\d.]+ms']
    deadline = time.monotonic() + 30  # a line is written as the answer ends: wait for it, boundedly
    while True:
        log = server.log.read_text()
        missing = [w for w in wanted if not re.search(r"INFO infinilm\.serve\.access: 127\.0\.0\.1 " + w, log)]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not missing, log[-2000:]
