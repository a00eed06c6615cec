"""``infinilm serve`` with a request whose logits are non-finite (issue #30 item 2): that request gets a JSON 500
naming the cause, a greedy request sharing its steps gets its tokens, and the server keeps serving."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from lm_helpers import hf_model
from test_serve import Server

BAD_TOKEN = 3  # its embedding row is inf: a prompt holding it gives NaN logits, no other prompt is touched


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = hf_model("llama", tied=False)
    with torch.no_grad():
        model.model.embed_tokens.weight[BAD_TOKEN] = float("inf")
    path = tmp_path_factory.mktemp("poisoned-llama")
    model.save_pretrained(str(path))
    server = Server(Path(path), "--max-model-len", "64", "--block-size", "8", "--num-blocks", "64",
                    log=tmp_path_factory.mktemp("logs") / "poisoned.err")
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log.read_text()


def _complete(server: Server, prompt: list[int], **fields: object) -> httpx.Response:
    body = {"model": "m", "prompt": prompt, "max_tokens": 6, **fields}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)


def test_a_request_with_non_finite_logits_fails_alone_with_a_json_500_naming_the_cause(server: Server) -> None:
    solo = _complete(server, [5, 6, 7], temperature=0, ignore_eos=True)
    assert solo.status_code == 200, solo.text
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        bad = [pool.submit(_complete, server, [9, BAD_TOKEN, 4], temperature=0.8, top_p=0.9) for _ in range(4)]
        good = [pool.submit(_complete, server, [5, 6, 7], temperature=0, ignore_eos=True) for _ in range(4)]
        bad_answers, good_answers = [f.result() for f in bad], [f.result() for f in good]
    for resp in bad_answers:
        assert resp.status_code == 500, resp.text
        assert "non-finite" in resp.json()["error"]["message"]
    for resp in good_answers:
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["text"] == solo.json()["choices"][0]["text"]
    streamed = httpx.post(f"{server.url}/v1/completions", timeout=60,
                          json={"model": "m", "prompt": [BAD_TOKEN], "max_tokens": 4, "stream": True})
    assert "non-finite" in streamed.text
    assert _complete(server, [5, 6, 7], temperature=0, ignore_eos=True).status_code == 200
