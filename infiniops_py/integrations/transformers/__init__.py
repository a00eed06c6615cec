"""Run a Hugging Face transformers model through InfiniOps-Py operators: ``kernelize(model)``.

As Hugging Face ``kernels.kernelize`` and Liger-Kernel's ``apply_liger_kernel_to_<family>`` do, one call swaps
a model's layers for the operators of this project, in place, on the model object it is given (other
instances of the same classes are untouched). Per family (`FAMILIES`, keyed by ``config.model_type``):

- every RMSNorm (Llama, Qwen2, Qwen3, Mamba-2 ``Mamba2RMSNorm``) whose forward is ``LlamaRMSNorm``'s ->
  `rms_norm`; Qwen3's per-head ``q_norm``/``k_norm`` too (over ``head_dim``, on the ``[B, S, H, D]``
  projection views).
  `fused_qk_norm` is not used: it needs the packed ``[T, (Hq + 2 Hkv) D]`` projection, and transformers
  computes q, k and v with three separate linears.
- the pre-norm decoder layer's ``residual + attention`` followed by ``post_attention_layernorm`` ->
  `fused_add_rms_norm` (Llama, Qwen2, Qwen3, when the layer's forward is the residual pattern that
  `kernelize` knows; otherwise the two norms are swapped on their own and the report says so). The
  layer's input is copied once first (the caller may still hold it: ``output_hidden_states``, a user's
  ``inputs_embeds``); the MLP's residual add then runs in place on that copy.
- attention -> the ``"infiniops"`` entry of transformers' ``AttentionInterface`` (and of its
  ``AttentionMaskInterface``, which hands it the 2-D padding mask, as for flash-attention, and over a static
  cache the mask of the tokens the cache holds):
  `flash_attn_varlen` for prefill (sequences packed back to back, padding rows dropped) and for padded
  batches, `flash_attn_with_kvcache` for decode steps over transformers' cache (a view of it, no copy).
  The causal mask is bottom-right aligned, as transformers' masks are for queries that follow a cache;
  a sliding window of ``w`` keys is ``window_size=(w - 1, 0)``; the scale is the module's ``scaling``.
- RoPE (``apply_rotary_pos_emb`` in the attention forward of Llama, Qwen2, Qwen3, when that forward is
  transformers' own statement for statement) -> one in-place `rotary_embedding` of q and k (NeoX pairs
  over the whole head) on the ``[T, H, D]`` projection views, the attention forward otherwise the same.
  Its ``cos_sin_cache`` is built once per forward from the model's own ``(cos, sin)`` (one row per token),
  so every RoPE type's values (scaled, dynamic) are transformers'; the rotation is rounded once from fp32.
- the gated MLP ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU (``config.hidden_act``
  ``"silu"``/``"swish"``; Llama, Qwen2, Qwen3) -> one gate|up projection then `silu_and_mul`, then
  ``down_proj``, as vLLM runs it. ``gate_proj.weight`` ``[I, H]`` and ``up_proj.weight`` become the two
  halves of one ``[2I, H]`` tensor, allocated once (the biases likewise): the same parameter objects with
  the same values, not a second copy of the weights. Another activation leaves the MLP as it is.

Left in transformers' code, and listed in `Kernelized.left` with the reason: any of the above whose module
is not what `kernelize` knows, and Mamba-2's gated ``MambaRMSNormGated`` (no operator is its float32
``x * silu(gate)`` then per-group RMSNorm: `silu_and_mul` rounds the product to the dtype) and
``Mamba2Mixer`` (its conv and scans stay transformers' own).

Every operator problem the swaps need is resolved first (`infiniops_py.resolve_closure`): when any has no
provider, one `GateError` lists them all and nothing is swapped. The swapped calls then resolve per call
like any other call (``use(...)`` scopes and ``INFINIOPS_*`` settings apply). The operators have no
backward: run the model under ``torch.no_grad()`` or ``torch.inference_mode()`` (``generate`` does);
a call with grad mode on and parameters that require grad raises the operators' `ContractError`.
"""

from __future__ import annotations

from infiniops_py.integrations.transformers._attention import ATTENTION
from infiniops_py.integrations.transformers._families import FAMILIES, SwapTargets
from infiniops_py.integrations.transformers._kernelize import kernelize
from infiniops_py.integrations.transformers._report import Kernelized

__all__ = ["ATTENTION", "FAMILIES", "Kernelized", "SwapTargets", "kernelize"]
