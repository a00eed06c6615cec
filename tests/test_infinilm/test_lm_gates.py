"""The gates of the attention families: every problem a step can call is in the plan, before any weight."""

from __future__ import annotations

import pytest
from lm_helpers import CheckpointFactory

from infinilm import EngineOptions, read_config
from infinilm.engine.gates import plan


@pytest.mark.parametrize(("window", "varlen", "kvcache"), [(8, True, True), (45, False, True), (49, False, False)])
def test_local_attention_is_gated_where_the_keys_can_outnumber_the_window(
    checkpoint: CheckpointFactory, window: int, varlen: bool, kvcache: bool
) -> None:
    """A prefill sees at most max_model_len keys (40), a decode the cache capacity of its blocks (3 x 16 = 48):
    flash-attention keeps the window only where it is shorter than those keys, so a window of 45 is local in
    decode alone and one of 49 nowhere."""
    path, _ = checkpoint("mistral", sliding_window=window)
    chosen = plan(read_config(path), EngineOptions(block_size=16, max_model_len=40)).chosen
    local = {p.op for p in chosen if p.op.startswith("flash_attn") and p.fields["local"]}
    assert local == {op for op, on in (("flash_attn_varlen", varlen), ("flash_attn_with_kvcache", kvcache)) if on}
    assert {p.op for p in chosen if p.op.startswith("flash_attn") and not p.fields["local"]} == {
        "flash_attn_varlen", "flash_attn_with_kvcache"}
