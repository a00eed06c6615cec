"""Run a Hugging Face transformers model through InfiniOps-Py operators: ``kernelize(model)``, and the
``"infiniops"`` attention implementation.

Importing this module registers ``"infiniops"`` with transformers' ``AttentionInterface`` and
``AttentionMaskInterface`` (`ATTENTION`), so ``AutoModelForCausalLM.from_pretrained(...,
attn_implementation="infiniops")`` runs the attention (only) through `flash_attn_varlen` and
`flash_attn_with_kvcache`, with no host reads and no graph break under ``torch.compile``.

As Hugging Face ``kernels.kernelize`` and Liger-Kernel's ``apply_liger_kernel_to_<family>`` do,
``kernelize(model, rms_norm=, fused_add_rms_norm=, attention=, rope=, swiglu=)`` swaps a model's layers for the
operators of this project, in place, on the model object it is given (other instances of the same classes are
untouched), and returns the model. Layers are recognised by transformers' own hub-kernel layer names
(``use_kernel_forward_from_hub("RMSNorm")``, where the ``kernels`` package makes transformers set them) and
otherwise by the family's classes (`FAMILIES`, keyed by ``config.model_type``: Llama, Qwen2, Qwen3, Mistral,
GLM-4, Gemma 2, Mamba-2), never by the text of their code; a subclass that overrides a forward is left alone.

- every RMSNorm -> `rms_norm` (Qwen3's per-head ``q_norm``/``k_norm`` too, on the ``[B, S, H, D]`` views;
  Gemma 2's ``(1 + weight)`` norm in float32, as Gemma computes it). Where the whole layer runs as one forward
  (below), the q/k norms run with RoPE in one `fused_qk_norm_rope` over the packed q|k|v projection instead.
- the decoder layer's ``residual + attention`` followed by ``post_attention_layernorm`` ->
  `fused_add_rms_norm` (Llama, Qwen2, Qwen3, Mistral, and GLM-4's layer with its extra post-attention and
  post-MLP norms). The layer's input is copied once first (the caller may still hold it:
  ``output_hidden_states``, a user's ``inputs_embeds``); the MLP's residual add then runs in place on that copy.
- attention -> the ``"infiniops"`` implementation (above), set on the model; an unpadded one-token decode step
  over a cache every row fills has no mask to apply and goes to torch's SDPA (a fraction of the host cost).
- RoPE (``apply_rotary_pos_emb`` in the attention forward) -> one in-place `rotary_embedding` of q and k on the
  ``[T, H, D]`` projection views (NeoX pairs over the whole head; GLM-4's interleaved pairs over its partial
  rotary dims), the attention forward otherwise transformers'. Its ``cos_sin_cache`` is built once per forward
  from the model's own ``(cos, sin)``, so every RoPE type's values (scaled, dynamic) are transformers'.
- the gated MLP with SiLU (``config.hidden_act`` ``"silu"``/``"swish"``) -> one gate|up projection, then
  `silu_and_mul`, then ``down_proj``, as vLLM runs it. ``gate_proj.weight`` ``[I, H]`` and ``up_proj.weight``
  become the two halves of one ``[2I, H]`` tensor, allocated once (the biases likewise): the same parameter
  objects with the same values, not a second copy of the weights (GLM-4's ``gate_up_proj`` is packed already).
  Another activation (Gemma 2's GELU) leaves the MLP as it is.
- a pre-norm decoder layer (Llama, Qwen2, Qwen3, Mistral) all of whose parts are swapped -> one forward over
  its parameters (`_layer.layer_forward`): `rms_norm`, one q|k|v projection (the three weights packed once, as
  the gate|up pair is), Qwen3's q/k norms and RoPE in one `fused_qk_norm_rope` (else one `rotary_embedding`),
  the cache update and attention function as transformers calls them, ``o_proj``, `fused_add_rms_norm`, the
  MLP above, and the residual add: no submodule is called (their hooks do not run; a submodule with a forward
  of its instance's own, as accelerate's hooks set, keeps the layer on the parts' swaps). Listed as ``layer``.

Left in transformers' code, and listed in `Kernelized.left` with the reason: any of the above whose module does
not keep its class's forward, and Mamba-2's gated ``MambaRMSNormGated`` and ``Mamba2Mixer``.

Every operator problem the swaps need is resolved first (`infiniops_py.resolve_closure`): when any has no
provider, one `GateError` lists them all and nothing is swapped. The swapped calls then resolve per call
like any other call (``use(...)`` scopes and ``INFINIOPS_*`` settings apply). The operators have no
backward: run the model under ``torch.no_grad()`` or ``torch.inference_mode()`` (``generate`` does);
a call with grad mode on and parameters that require grad raises the operators' `ContractError`.
"""

from __future__ import annotations

from infiniops_py.integrations.transformers._attention import ATTENTION, register
from infiniops_py.integrations.transformers._families import FAMILIES, SwapTargets
from infiniops_py.integrations.transformers._kernelize import kernelize
from infiniops_py.integrations.transformers._report import Kernelized

__all__ = ["ATTENTION", "FAMILIES", "Kernelized", "SwapTargets", "kernelize"]

register()  # transformers finds attn_implementation="infiniops" from the import on (issue #28)
