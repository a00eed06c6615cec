"""`infiniops_py.integrations.transformers.kernelize` on tiny random transformers models (nothing downloaded):
logits and greedy generation equal the unpatched model's, the swapped calls go through the operators, the
gates run before anything is swapped, and `restore` undoes the swaps."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "test_infinilm"))
from lm_helpers import hf_config

from infiniops_py import GateError, runtime
from infiniops_py.integrations.transformers import ATTENTION, Kernelized, kernelize
from infiniops_py.testing.tolerances import Allclose, tolerance

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "glm4", "gemma2", "mamba2")
_DECODER = {"rms_norm", "fused_add_rms_norm", "flash_attn_varlen", "silu_and_mul", "rotary_embedding"}
# the operators each family's kernelized forward must call
CALLED = {**dict.fromkeys(("llama", "qwen2", "mistral", "glm4"), _DECODER),
          "qwen3": {*_DECODER - {"rotary_embedding"}, "fused_qk_norm_rope"},  # its q/k norms and RoPE in one call
          "gemma2": {"rms_norm", "flash_attn_varlen", "rotary_embedding"}, "mamba2": {"rms_norm"}}


def _model(family: str, dtype: torch.dtype = torch.float32, seed: int = 0, **extra: object) -> torch.nn.Module:
    """A 2-layer model of `hf_config` (the infinilm tests' tiny configs: Llama with attention and MLP biases,
    Mistral's and Gemma 2's short sliding windows, Gemma 2's small softcaps, GLM-4's partial RoPE; `extra`: more
    config fields), random weights (norm weights around 1, so that a norm applied with the wrong weight changes
    the logits; Gemma's around 0, its norms multiplying by 1 + weight), eval mode; Gemma 2 with transformers' eager
    attention, which keeps its softcap."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    eager = {"attn_implementation": "eager"} if family == "gemma2" else {}
    model = AutoModelForCausalLM.from_config(hf_config(family, tied=False, **extra), **eager).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_((0.0 if family == "gemma2" else 1.0) + 0.1 * torch.randn_like(p))
    return model.to(dtype)


def _pair(family: str, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, torch.nn.Module, Kernelized]:
    model = _model(family, dtype)
    patched = copy.deepcopy(model)
    assert kernelize(patched) is patched
    return model, patched, patched.infiniops_kernelized


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 7 tokens, the first left-padded by 3 (transformers' padding for generation)."""
    torch.manual_seed(1)
    ids = torch.randint(1, 150, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return ids, mask


def _assert_same_logits(patched: torch.nn.Module, model: torch.nn.Module, ids: torch.Tensor,
                        caches: list[Any] | None = None) -> None:
    """fp32 logits of `patched` and `model` on `ids` (each over its own cache of `caches`: the model's first)
    agree within rms_norm's fp32 tolerance."""
    tol = tolerance("rms_norm", "float32")
    assert isinstance(tol, Allclose)
    kwargs = [{} for _ in range(2)] if caches is None else [{"past_key_values": c} for c in caches]
    with torch.no_grad():
        torch.testing.assert_close(patched(ids, **kwargs[1]).logits, model(ids, **kwargs[0]).logits,
                                   rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize(("family", "dtype"), [*((f, torch.float32) for f in FAMILIES),
                                                ("mamba2", torch.bfloat16)])
def test_kernelize_logits_equal_the_unpatched_models(family: str, dtype: torch.dtype) -> None:
    # bfloat16 Mamba-2 keeps its residual stream in float32: norm_f gets float32 input, a bfloat16 weight
    model, patched, report = _pair(family, dtype)
    ids, mask = _ids()
    tol = tolerance("rms_norm", str(dtype).removeprefix("torch."))
    assert isinstance(tol, Allclose)
    runtime.get_resolver().cache.clear()
    with torch.no_grad():
        torch.testing.assert_close(patched(ids).logits, model(ids).logits, rtol=tol.rtol, atol=tol.atol)
        real = mask.bool()  # padding positions have no meaningful logits in either model
        torch.testing.assert_close(patched(ids, attention_mask=mask).logits[real],
                                   model(ids, attention_mask=mask).logits[real], rtol=tol.rtol, atol=tol.atol)
    called = {key[0] for key in runtime.get_resolver().cache}
    assert CALLED[family] <= called, f"the kernelized forward called {sorted(called)}"
    assert report.swapped["rms_norm"], report.render()
    if family == "qwen3":
        assert len(report.swapped["qk_norm"]) == 4  # q_norm and k_norm of both layers
    if family == "mamba2":
        assert any("MambaRMSNormGated" in why for why in report.left)
        return
    assert patched.config._attn_implementation == ATTENTION
    assert len(report.swapped["rope"]) == len(report.swapped["attention"]) == 2
    assert "rotary_embedding by" in report.render()
    if family == "gemma2":  # GELU MLPs and (1 + weight) norms: no silu_and_mul, no fused residual norm
        assert sorted(why.partition(":")[0] for why in report.left) == [
            "Gemma2DecoderLayer", "model.layers.0.mlp (Gemma2MLP)", "model.layers.1.mlp (Gemma2MLP)"]
        assert len(report.swapped["rms_norm"]) == 9  # 4 per layer and the final one
        return
    assert len(report.swapped["fused_add_rms_norm"]) == len(report.swapped["gated_mlp"]) == 2
    assert "silu_and_mul by" in report.render()
    # the pre-norm layers run as one forward over their parts (GLM-4's sandwich layer keeps the parts' swaps)
    assert report.swapped.get("layer", []) == ([] if family == "glm4" else ["model.layers.0", "model.layers.1"])
    assert not report.left, report.render()  # the MLP and RoPE run through the operators too


@pytest.mark.parametrize("family", FAMILIES)
def test_kernelize_generate_gives_the_unpatched_models_tokens(family: str) -> None:
    model, patched, _ = _pair(family)
    ids, mask = _ids()
    runtime.get_resolver().cache.clear()
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):  # prefill + kvcache decode; padded varlen prefill and decode
            expected = model.generate(ids, max_new_tokens=6, do_sample=False, **kwargs)
            got = patched.generate(ids, max_new_tokens=6, do_sample=False, **kwargs)
            assert torch.equal(got, expected), kwargs
    if family != "mamba2":
        assert "flash_attn_with_kvcache" in {key[0] for key in runtime.get_resolver().cache}


def test_kernelize_attention_keeps_packed_sequences_apart() -> None:
    # one row holding two sequences (position_ids restart at 0): each attends only to itself, as
    # transformers' flash-attention path does (its sdpa path attends across the boundary)
    model = _model("qwen3")
    kernelize(model)
    torch.manual_seed(2)
    ids = torch.randint(1, 150, (1, 7))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    with torch.no_grad():
        packed = model(ids, position_ids=positions).logits
        first, second = model(ids[:, :4]).logits, model(ids[:, 4:]).logits
    torch.testing.assert_close(packed, torch.cat([first, second], dim=1), rtol=1e-5, atol=1e-5)


def test_kernelize_gates_every_problem_before_swapping_anything() -> None:
    model = _model("qwen3")
    pointers = [p.data_ptr() for p in model.parameters()]
    with pytest.raises(GateError) as caught:
        kernelize(model, device="tpu")  # no provider serves tpu
    err = caught.value
    assert {p.op for p, _ in err.gaps} == {"rms_norm", "fused_add_rms_norm", "flash_attn_varlen",
                                           "flash_attn_with_kvcache", "silu_and_mul", "rotary_embedding"}
    assert [p.get("d") for p, _ in err.gaps if p.op == "silu_and_mul"] == [96]  # the intermediate size
    assert [(p.get("head_dim"), p.get("rotary_dim"), p.get("is_neox")) for p, _ in err.gaps
            if p.op == "rotary_embedding"] == [(32, 32, True)]
    assert sorted(p.get("hidden_size") for p, _ in err.gaps if p.op == "rms_norm") == [32, 64]  # q/k and hidden
    assert "nothing was swapped" in str(err)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert model.config._attn_implementation != ATTENTION
    assert not hasattr(model, "infiniops_kernelized")
    assert [p.data_ptr() for p in model.parameters()] == pointers  # no gate|up weights packed either


def test_kernelize_restore_puts_back_transformers_forwards_and_parameters(tmp_path: Path) -> None:
    model = _model("llama")  # MLP biases too
    before = model.config._attn_implementation
    params = {name: id(p) for name, p in model.named_parameters()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    first = kernelize(model).infiniops_kernelized
    mlp = model.model.layers[0].mlp
    packed = mlp.up_proj.weight.data_ptr()
    second = kernelize(model).infiniops_kernelized  # again: the first swaps are undone first, nothing wraps twice
    assert not first.swapped and second.swapped
    assert sum("forward" in m.__dict__ for m in model.modules()) == 5 + 2 + 2 + 2  # norms, layers, MLPs, RoPE
    assert mlp.up_proj.weight.data_ptr() == packed
    for proj in ("weight", "bias"):  # up right after gate in one [2I, ...] buffer
        gate, up = getattr(mlp.gate_proj, proj), getattr(mlp.up_proj, proj)
        assert up.data_ptr() == gate.data_ptr() + gate.numel() * gate.element_size()
    second.restore()
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert model.config._attn_implementation == before
    assert {name: id(p) for name, p in model.named_parameters()} == params  # the same parameter objects
    after = model.state_dict()
    assert after.keys() == state.keys()
    for name, value in state.items():
        assert after[name].shape == value.shape and torch.equal(after[name], value), name
    model.save_pretrained(tmp_path)  # the packed views save as separate tensors and load back
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    assert all(torch.equal(loaded[name], value) for name, value in state.items() if name in loaded)
    assert {n for n in state if "mlp" in n} <= loaded.keys()


def test_kernelize_leaves_a_gated_mlp_whose_activation_is_not_silu() -> None:
    # silu_and_mul is SiLU's: a GELU-gated MLP keeps transformers' forward, and the report says why
    model = _model("qwen3", hidden_act="gelu_pytorch_tanh")
    patched = copy.deepcopy(model)
    pointers = [p.data_ptr() for p in patched.parameters()]
    report = kernelize(patched).infiniops_kernelized
    assert "gated_mlp" not in report.swapped
    assert not any("forward" in m.__dict__ for m in patched.modules() if type(m).__name__ == "Qwen3MLP")
    assert sum("hidden_act='gelu_pytorch_tanh'" in why for why in report.left) == 2, report.render()
    assert [p.data_ptr() for p in patched.parameters()] == pointers  # nothing packed
    _assert_same_logits(patched, model, _ids()[0])


def test_kernelize_mlp_uses_weights_replaced_after_packing() -> None:
    # a parameter replaced (or moved by model.to) after kernelize no longer lies in the packed gate|up (or q|k|v)
    # buffer: the layer computes with the new weights, not with the stale packed ones
    model, patched, _ = _pair("llama")
    torch.manual_seed(4)
    with torch.no_grad():
        for plain, kernelized in zip(model.model.layers, patched.model.layers, strict=True):
            up = 0.1 * torch.randn_like(plain.mlp.up_proj.weight)
            bias = torch.randn_like(plain.mlp.gate_proj.bias)
            key = 0.1 * torch.randn_like(plain.self_attn.k_proj.weight)
            value_bias = torch.randn_like(plain.self_attn.v_proj.bias)
            for mlp in (plain.mlp, kernelized.mlp):
                mlp.up_proj.weight = torch.nn.Parameter(up.clone())
                mlp.gate_proj.bias = torch.nn.Parameter(bias.clone())
            for attn in (plain.self_attn, kernelized.self_attn):
                attn.k_proj.weight = torch.nn.Parameter(key.clone())
                attn.v_proj.bias = torch.nn.Parameter(value_bias.clone())
    runtime.get_resolver().cache.clear()
    _assert_same_logits(patched, model, _ids()[0])
    assert "silu_and_mul" in {key[0] for key in runtime.get_resolver().cache}


def test_kernelize_keeps_the_parts_swaps_of_a_layer_with_a_hooked_forward() -> None:
    # a submodule whose instance has a forward of its own (accelerate's hooks wrap it so) must still be called:
    # its layer keeps the swaps of its parts rather than running as one forward
    model = _model("qwen3")
    patched = copy.deepcopy(model)
    calls: list[int] = []
    proj = patched.model.layers[1].self_attn.q_proj
    plain_forward = proj.forward

    def hooked(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return plain_forward(x)

    proj.forward = hooked
    report = kernelize(patched).infiniops_kernelized
    assert report.swapped["layer"] == ["model.layers.0"]
    assert len(report.swapped["fused_add_rms_norm"]) == 2
    _assert_same_logits(patched, model, _ids()[0])
    assert calls


def test_kernelize_layers_keep_the_attention_weights_of_eager_attention() -> None:
    # the one-forward layer calls no attention module, whose forward hook records output_attentions: under
    # transformers' eager attention (the one that returns weights) the layer runs its parts' swaps instead
    model = _model("qwen3")
    model.set_attn_implementation("eager")
    patched = kernelize(copy.deepcopy(model), attention=False)
    assert patched.infiniops_kernelized.swapped["layer"] == ["model.layers.0", "model.layers.1"]
    ids = _ids()[0]
    with torch.no_grad():
        ours, theirs = (m(ids, output_attentions=True) for m in (patched, model))
    assert len(ours.attentions) == len(theirs.attentions) == 2
    tol = tolerance("rms_norm", "float32")
    assert isinstance(tol, Allclose)
    for got, want in zip(ours.attentions, theirs.attentions, strict=True):
        torch.testing.assert_close(got, want, rtol=tol.rtol, atol=tol.atol)
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("rope", [
    {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},  # frequencies rescaled past 16 positions
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8, "rope_theta": 10000.0},
])
def test_kernelize_rope_rotates_by_transformers_values_of_scaled_rope_types(rope: dict[str, object]) -> None:
    # the cos_sin_cache is the forward's own (cos, sin), so a RoPE type whose frequencies depend on the sequence
    # length (dynamic NTK) or are rescaled (llama3) rotates as transformers does
    model = _model("llama", max_position_embeddings=16, rope_parameters=rope)
    patched = copy.deepcopy(model)
    report = kernelize(patched).infiniops_kernelized
    assert len(report.swapped["rope"]) == 2
    torch.manual_seed(5)
    ids = torch.randint(1, 150, (2, 24))
    tol = tolerance("rotary_embedding", "float32")
    assert isinstance(tol, Allclose)
    runtime.get_resolver().cache.clear()
    with torch.no_grad():
        torch.testing.assert_close(patched(ids).logits, model(ids).logits, rtol=tol.rtol, atol=tol.atol)
    assert "rotary_embedding" in {key[0] for key in runtime.get_resolver().cache}


def test_kernelize_leaves_rope_in_an_attention_forward_it_does_not_know() -> None:
    # an attention forward other than transformers' own statements keeps its RoPE (kernelize replaces the whole
    # forward to rotate q and k in place, so it must know every step); its attention still dispatches to ATTENTION
    from transformers.models.llama.modeling_llama import LlamaAttention

    def forward(self: LlamaAttention, *args: object, **kwargs: object) -> tuple[torch.Tensor, object]:
        out, weights = LlamaAttention.forward(self, *args, **kwargs)
        return 2 * out, weights

    doubled = type("LlamaAttention", (LlamaAttention,), {"forward": forward})  # the family's class name
    model = _model("llama")
    model.model.layers[0].self_attn.__class__ = doubled
    patched = copy.deepcopy(model)
    report = kernelize(patched).infiniops_kernelized
    assert report.swapped["rope"] == ["model.layers.1.self_attn"]
    assert len(report.swapped["attention"]) == 2
    assert [why.partition(":")[0] for why in report.left] == ["model.layers.0.self_attn (LlamaAttention)"]
    assert "rotary embeddings stay transformers' own" in report.left[0]
    _assert_same_logits(patched, model, _ids()[0])


def test_kernelize_refuses_training_mode_and_unknown_families() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(ValueError, match="mode='inference'"):
        kernelize(_model("llama"), mode="training")
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16))
    supported = "llama, qwen2, qwen3, mistral, glm4, gemma2, mamba2"
    with pytest.raises(ValueError, match=rf"model_type 'gpt2'.*supported: {supported}"):
        kernelize(gpt2)
    with pytest.raises(TypeError, match="device"):
        kernelize(_model("llama"), device=3)  # type: ignore[arg-type]


def test_kernelize_attention_rereads_position_ids_written_in_place() -> None:
    # the layers of a forward share one read of position_ids; a tensor rewritten in place (a static buffer
    # reused across forwards) is read again, not taken from the previous forward
    model = _model("qwen3")
    kernelize(model)
    torch.manual_seed(3)
    ids = torch.randint(1, 150, (1, 7))
    positions = torch.arange(7).unsqueeze(0)
    with torch.inference_mode():  # inference tensors: no version counter to tell an in-place write by
        positions = positions.clone()
        whole = model(ids, position_ids=positions).logits
        positions[0, 4:] = torch.arange(3)  # now two sequences: 4 and 3 tokens
        packed = model(ids, position_ids=positions).logits
        first, second = model(ids[:, :4]).logits, model(ids[:, 4:]).logits
    torch.testing.assert_close(packed, torch.cat([first, second], dim=1), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(whole[:, 4:], packed[:, 4:])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_kernelize_generate_over_a_static_cache_reads_only_the_tokens_it_holds(family: str) -> None:
    # a StaticCache hands attention all max_cache_len keys, the unwritten ones included; transformers keeps the
    # padding mask for flash attention then, but only for implementations named "flash...": kernelized attention got
    # no mask and attended to the unwritten keys, so generate's tokens (and the logits) differed from the model's
    from transformers import StaticCache

    model, patched, _ = _pair(family)
    ids, mask = _ids()
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            expected = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static", **kwargs)
            got = patched.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static", **kwargs)
            assert torch.equal(got, expected), kwargs
        caches = [StaticCache(config=m.config, max_cache_len=16) for m in (model, patched)]
        for chunk in (ids[:, :4], ids[:, 4:]):  # a prefill, then more tokens over the cache
            _assert_same_logits(patched, model, chunk, caches)


def test_kernelize_leaves_a_norm_of_the_family_class_name_whose_forward_differs() -> None:
    # a norm class named like the family's (a subclass, a patched copy) whose forward is not LlamaRMSNorm's was
    # swapped for rms_norm on its attributes alone (a 1-D weight and a variance_epsilon): here a Gemma-style
    # (1 + weight) norm, whose logits then changed silently
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    def forward(self: LlamaRMSNorm, x: torch.Tensor) -> torch.Tensor:
        v = x.float().pow(2).mean(-1, keepdim=True)
        return ((x.float() * torch.rsqrt(v + self.variance_epsilon)) * (1.0 + self.weight.float())).to(x.dtype)

    gemma_like = type("LlamaRMSNorm", (LlamaRMSNorm,), {"forward": forward})
    model = _model("llama")
    model.model.layers[1].input_layernorm.__class__ = gemma_like
    patched = copy.deepcopy(model)
    report = kernelize(patched).infiniops_kernelized
    assert "model.layers.1.input_layernorm" not in report.swapped["rms_norm"]
    assert len(report.swapped["rms_norm"]) == 4  # the other norms: 2 per layer and the final one
    # the fused layer calls the input norm as it is (only the post-attention norm fuses): both layers fuse
    assert report.swapped["fused_add_rms_norm"] == ["model.layers.0", "model.layers.1"]
    assert [why.partition(":")[0] for why in report.left] == ["model.layers.1.input_layernorm (LlamaRMSNorm)"]
    _assert_same_logits(patched, model, _ids()[0])


def test_kernelize_returns_the_model_with_the_report_in_repr_and_switches_off_what_it_is_told() -> None:
    # HF kernels.kernelize returns the model; Liger's apply_liger_kernel_to_<family>(rope=, rms_norm=, swiglu=)
    # switches each swap
    model = _model("qwen3")
    patched = copy.deepcopy(model)
    assert kernelize(patched, rope=False, swiglu=False, fused_add_rms_norm=False) is patched
    report = patched.infiniops_kernelized
    assert set(report.swapped) == {"rms_norm", "qk_norm", "attention"}
    assert report.off == ["fused_add_rms_norm", "rope", "swiglu"]
    assert "kernelized qwen3 for cpu:" in repr(patched) and "off: fused_add_rms_norm, rope, swiglu" in repr(patched)
    assert not any("forward" in m.__dict__ for m in patched.modules() if type(m).__name__ in (
        "Qwen3MLP", "Qwen3Attention", "Qwen3DecoderLayer"))
    _assert_same_logits(patched, model, _ids()[0])
    assert kernelize(patched, attention=False, rms_norm=False) is patched  # again, other switches
    assert patched.config._attn_implementation != ATTENTION
    assert set(patched.infiniops_kernelized.swapped) == {"fused_add_rms_norm", "rope", "gated_mlp"}
    _assert_same_logits(patched, model, _ids()[0])
    patched.infiniops_kernelized.restore()
    assert "kernelized" not in repr(patched) and not hasattr(patched, "infiniops_kernelized")
    with pytest.raises(TypeError, match="rope=1"):
        kernelize(patched, rope=1)  # type: ignore[arg-type]


_FRESH = """
import json, sys
import torch
import infiniops_py.integrations.transformers  # registers attn_implementation="infiniops"
from infiniops_py import runtime
from transformers import AutoModelForCausalLM

path, ids = sys.argv[1], torch.tensor(json.loads(sys.argv[2]))
ours = AutoModelForCausalLM.from_pretrained(path, attn_implementation="infiniops").eval()
stock = AutoModelForCausalLM.from_pretrained(path).eval()
with torch.no_grad():
    got, expected = ours(ids).logits, stock(ids).logits
    tokens = [m.generate(ids, max_new_tokens=5, do_sample=False).tolist() for m in (ours, stock)]
print(json.dumps({"implementation": ours.config._attn_implementation, "got": got.tolist(),
                  "expected": expected.tolist(), "same_tokens": tokens[0] == tokens[1],
                  "called": sorted({key[0] for key in runtime.get_resolver().cache})}))
"""


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_attn_implementation_infiniops_works_first_in_a_fresh_process(family: str, tmp_path: Path) -> None:
    # from_pretrained(attn_implementation="infiniops") raised until kernelize had run once in the process
    import json
    import os
    import subprocess
    import sys

    _model(family).save_pretrained(tmp_path)
    ids = torch.randint(1, 150, (2, 6), generator=torch.Generator().manual_seed(6)).tolist()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path), json.dumps(ids)], capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["implementation"] == ATTENTION
    # an unpadded decode step of one token per row goes to torch's SDPA (no mask to apply); Gemma 2's softcap not
    assert {"flash_attn_varlen", *(["flash_attn_with_kvcache"] if family == "gemma2" else [])} <= set(found["called"])
    assert found["same_tokens"]
    tol = tolerance("rms_norm", "float32")
    assert isinstance(tol, Allclose)
    torch.testing.assert_close(torch.tensor(found["got"]), torch.tensor(found["expected"]), rtol=tol.rtol,
                               atol=tol.atol)


def test_kernelize_matches_layers_by_class_not_by_the_text_of_their_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    # kernelize compared the normalised source of a forward with transformers': a transformers release that
    # wrote Qwen3Attention.forward differently (5.17.0 on the H200) left RoPE unswapped in every layer
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    original = Qwen3Attention.forward

    def reformatted(self: Qwen3Attention, *args: Any, **kwargs: Any) -> Any:  # the same computation, other text
        result = original(self, *args, **kwargs)
        return result

    monkeypatch.setattr(Qwen3Attention, "forward", reformatted)
    model, patched, report = _pair("qwen3")
    assert report.swapped["rope"] == ["model.layers.0.self_attn", "model.layers.1.self_attn"], report.render()
    assert not report.left, report.render()
    _assert_same_logits(patched, model, _ids()[0])


def test_kernelize_matches_transformers_hub_kernel_layer_names() -> None:
    # with the kernels package installed, transformers' @use_kernel_forward_from_hub("RMSNorm") sets
    # kernel_layer_name on a class: HF kernels.kernelize swaps by that name, and so does kernelize, for a
    # class of any name or module (here one that is in no family)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return LlamaRMSNorm.forward(self, x)  # type: ignore[arg-type]

    hub_norm = type("SomeRMSNorm", (torch.nn.Module,), {"forward": forward, "kernel_layer_name": "RMSNorm",
                                                        "__module__": __name__})
    model = _model("llama")
    model.model.norm.__class__ = hub_norm
    patched = copy.deepcopy(model)
    report = kernelize(patched).infiniops_kernelized
    assert "model.norm" in report.swapped["rms_norm"] and len(report.swapped["rms_norm"]) == 5
    assert "forward" in patched.model.norm.__dict__
    _assert_same_logits(patched, model, _ids()[0])


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_kernelized_model_compiles_fullgraph_without_graph_breaks(family: str) -> None:
    # the attention read the mask and position_ids on the host (Tensor.item(), .cpu()): 14 graphs, 13 breaks, and
    # fullgraph=True raised a data-dependent guard (issue #25)
    model, patched, _ = _pair(family)
    torch.manual_seed(7)
    ids = torch.randint(1, 150, (1, 7))
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])  # two sequences in one row: the traced packing
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(patched)(ids)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        torch._dynamo.reset()
        compiled = torch.compile(patched, fullgraph=True)
        tol = tolerance("rms_norm", "float32")
        assert isinstance(tol, Allclose)
        torch.testing.assert_close(compiled(ids).logits, patched(ids).logits, rtol=tol.rtol, atol=tol.atol)
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits, rtol=tol.rtol, atol=tol.atol)
        torch.testing.assert_close(compiled(ids, position_ids=packed).logits, patched(ids, position_ids=packed).logits,
                                   rtol=tol.rtol, atol=tol.atol)
        padded, mask = _ids()  # a left-padded batch: the traced mask keeps its key spans, read by no host
        real = mask.bool()
        torch.testing.assert_close(compiled(padded, attention_mask=mask).logits[real],
                                   model(padded, attention_mask=mask).logits[real], rtol=tol.rtol, atol=tol.atol)
    torch._dynamo.reset()


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_kernelize_twice_in_inference_mode_on_a_model_copied_there(family: str) -> None:
    # a model copied under inference_mode has inference tensors for parameters: packing their gate|up views
    # outside inference mode raised "Inference tensors do not track version counter" on the second kernelize
    # (and in the forward); Gemma's norms hold 1 + weight by the weight's version, which such a weight has not
    model = _model(family)
    with torch.inference_mode():
        patched = copy.deepcopy(model)
        kernelize(patched)
        kernelize(patched)  # the pairs are packed now: only their views are taken
        assert len(patched.infiniops_kernelized.swapped["rms_norm"]) in (5, 9)
    _assert_same_logits(patched, model, _ids()[0])


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_kernelize_sliding_window_layers_generate_the_stock_tokens(family: str) -> None:
    # a window of 4 keys, prompts of 9: the window (and Gemma 2's alternating window and softcap) bites, over
    # dynamic and static caches, with and without left padding
    model = _model(family, sliding_window=4)
    patched = kernelize(copy.deepcopy(model))
    torch.manual_seed(8)
    ids = torch.randint(1, 150, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    _assert_same_logits(patched, model, ids)
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}, {"cache_implementation": "static"},
                       {"attention_mask": mask, "cache_implementation": "static"}):
            expected = model.generate(ids, max_new_tokens=6, do_sample=False, **kwargs)
            assert torch.equal(patched.generate(ids, max_new_tokens=6, do_sample=False, **kwargs), expected), kwargs
