"""The gates' problems come from the model's forward traced on meta tensors: they are what a real forward calls."""

from __future__ import annotations

import pytest
import torch
from fakes import cpu_capability, registered
from lm_helpers import CheckpointFactory, headers_only

from infinilm import Engine, EngineOptions, SamplingParams, read_config
from infinilm.engine.gates import plan
from infinilm.engine.trace import traced_problems
from infiniops_py import GateError, OneOf, Problem
from infiniops_py.dispatch import Dispatched, observing
from infiniops_py.operators.rms_norm import reference as rms_norm_reference

_OPTIONS = {"block_size": 16, "max_model_len": 40}
_SAMPLER = "top_k_top_p_sampling_from_logits"  # the engine's sampler: not the model's forward


def _dispatched(engine: Engine, recurrent: bool) -> set[Problem]:
    """The problems (without bucket) a real CPU engine's forwards dispatch: a one-token prompt and a 33-token one
    (a one-block and a three-block decode after each), two prompts in one step, and, for a recurrent model, a
    prefill graph's padded prompts (its step, run eagerly: graphs are CUDA only)."""
    seen: set[Problem] = set()

    def record(call: Dispatched) -> None:
        if call.spec.name != _SAMPLER:
            seen.add(call.spec.problem_from_key(call.key).without_bucket())

    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    with observing(record):
        for prompts in ([[7]], [[7] * 33], [[7], [8, 9, 10]]):
            engine.generate(prompts, params)
        if recurrent:
            with torch.inference_mode():
                for n in (1, 4):
                    seq_idx = torch.zeros(1, n, dtype=torch.int32)
                    seq_idx[0, 0] = -1
                    row = torch.zeros(1, dtype=torch.int64)
                    engine.runner.prefill_step(torch.zeros(n, dtype=torch.int64), seq_idx, row)
    return seen


@pytest.mark.parametrize(("family", "overrides"), [
    ("llama", {}), ("qwen2", {}), ("qwen3", {}), ("glm4", {}), ("gemma2", {}), ("mistral", {}),
    ("mistral", {"sliding_window": 45}), ("mamba2", {}),
])
def test_the_traced_problems_are_those_a_real_forward_dispatches(
    checkpoint: CheckpointFactory, family: str, overrides: dict[str, object]
) -> None:
    """The meta trace of each family's forward finds exactly the problems its real forwards call on the CPU (the
    engine's prefills, decodes of one and of several blocks, packed prompts), and the gates resolve those."""
    path, _ = checkpoint(family, **overrides)
    options = EngineOptions(**_OPTIONS)
    engine = Engine.from_pretrained(path, options)
    traced = traced_problems(engine.config, options, engine.plan)
    assert traced and len(traced) == len(set(traced))
    assert set(traced) == _dispatched(engine, family == "mamba2")
    assert set(traced) <= set(plan(read_config(path), options).chosen)


def test_a_gate_error_names_a_traced_problem_before_any_weight_is_read(
    checkpoint: CheckpointFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gates trace on meta tensors, so a problem no allowed provider serves is refused with the problem named,
    and no tensor data read (the headers only: reading any tensor fails the test)."""
    path, _ = checkpoint("llama")
    narrow = ("narrow", [("rms_norm", cpu_capability(OneOf("hidden_size", (32,))), 1, rms_norm_reference)])
    headers_only(monkeypatch)
    with registered(narrow), pytest.raises(GateError) as err:
        Engine.from_pretrained(path, EngineOptions(**_OPTIONS, providers=(("rms_norm", "narrow"),)))
    assert "rms_norm" in str(err.value) and "hidden_size=64 not in {32}" in str(err.value)
