"""The decoder-only attention model of the Llama-like families (HF ``LlamaForCausalLM`` and its kin).

A `DecoderModel` is an embedding, `DecoderLayer`s (pre-norm attention, then pre-norm SwiGLU MLP, the
residual stream kept apart) and a final norm before the LM head. The families differ in data from
`ModelConfig` (Qwen2's q/k/v bias, Qwen3's per-head q/k norms, Llama's optional attention and MLP biases, a
head tied to the embedding), and a family module may subclass both classes: `DecoderModel.attention` gives a
layer's attention (its window, softcap and scale), `DecoderModel.layer_class` the layer (`SandwichLayer` adds a
norm after each sub-block), `DecoderLayer.norm_class` every norm. Every Gemm, Add,
RmsNorm, FusedQkNorm, RoPE (`rotary_embedding`, or `fused_qk_norm_rope` with Qwen3's q/k norms where the gate
plan fuses them), SiLU-and-multiply (`silu_and_mul`, or `gemm_swiglu` with the
gate/up projection where the gate plan fuses them), cache write and attention runs through `infiniops_py`; the
embedding lookup is plain PyTorch. Where the gate plan fuses the residual add and norm (``plan.fused_add_norm``,
issue #23) the o projection, the residual add and the post-attention norm are one `gemm_add_rms_norm`, and so are
the down projection, its add and the next layer's input norm (the last layer's: the final norm): a layer then
takes its input already normed, and the model's output is the final norm's. Where the plan folds each norm into
the next projection's prologue instead (``plan.prologue_norm``, issue #23: ``add_norm="prologue"``) a layer takes
and returns the residual stream itself: ``qkv = rms_norm_gemm(stream, input norm, W_qkv)``, ``stream = gemm(attn,
W_o, c=stream, beta=1)``, ``act = rms_norm_gemm(stream, post-attention norm, W_gate_up, swiglu=True)``, ``stream =
gemm(act, W_down, c=stream, beta=1)``, and the final norm runs in the LM head's `rms_norm_gemm` (`logits`); the
Gemm adds ``c`` in fp32 before its one rounding, where `fused_add_rms_norm` rounds the projection first, so the
values differ from the separate path's within the rounding of one add. Weights are allocated empty and
filled by the loader through `targets()`, which maps each checkpoint tensor name to the view it loads into.

Tensor parallelism (``plan.parallel`` set, the layout of `infinilm.distributed.parallel`): the embedding and the
head are vocab-parallel, q/k/v and gate/up column-parallel (this rank's heads and intermediate rows), o and down
row-parallel (one all-reduce each), the norms whole on every rank; each layer's attention and the KV cache
hold this rank's heads (`TensorParallel.local_config`), and `targets()` maps names to `Shard`s.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from infinilm.config import ModelConfig
from infinilm.distributed.parallel import Shard
from infinilm.layers.activation import silu_and_mul
from infinilm.layers.attention import Attention, AttnContext, PagedKV
from infinilm.layers.embedding import Embedding, LMHead, ParallelLMHead, VocabParallelEmbedding
from infinilm.layers.linear import ColumnParallelLinear, Linear, RowParallelLinear
from infinilm.layers.norm import QKNorm, RMSNorm
from infinilm.layers.rotary import RotaryEmbedding
from infinilm.models.family import GatePlan
from infiniops_py import gemm, gemm_swiglu, rms_norm_gemm

__all__ = ["DecoderLayer", "DecoderModel", "SandwichLayer", "fused_add_norm", "prologue_norm"]


class DecoderLayer:
    """Pre-norm attention block then pre-norm SwiGLU MLP over ``[T, hidden]``, with the residual kept apart.

    `attention` and `mlp` are the two sub-blocks (without their norms); `norm_class` makes every norm of the
    layer (and the model's final one); `attn_out_norm` and `mlp_out_norm`, None here, are the norms a
    `SandwichLayer` applies to each sub-block's output.
    """

    __slots__ = ("attn", "attn_out_norm", "down_proj", "fused_add_norm", "fused_rope", "fused_swiglu", "gate_up_proj",
                 "input_layernorm", "kv", "mlp_out_norm", "o_proj", "post_attention_layernorm", "prologue_norm",
                 "qk_norm", "qkv_proj")
    norm_class: ClassVar[type[RMSNorm]] = RMSNorm
    # the o and down projections may run with the add and the next norm (a layer that norms each sub-block's
    # output in between may not)
    fuses_add_norm: ClassVar[bool] = True

    def __init__(self, c: ModelConfig, plan: GatePlan, attn: Attention, dtype: torch.dtype,
                 device: torch.device) -> None:
        new = {"dtype": dtype, "device": device}
        self.input_layernorm = self.norm_class(c.hidden_size, c.rms_norm_eps, **new)
        self.post_attention_layernorm = self.norm_class(c.hidden_size, c.rms_norm_eps, **new)
        self.qkv_proj: Linear
        self.o_proj: Linear | RowParallelLinear
        self.gate_up_proj: Linear
        self.down_proj: Linear | RowParallelLinear
        tp = plan.parallel
        if tp is None:
            self.qkv_proj = Linear(c.hidden_size, {"q_proj": c.q_size, "k_proj": c.kv_size, "v_proj": c.kv_size},
                                   bias=c.qkv_bias, fuse_bias=plan.fused_bias, **new)
            self.o_proj = Linear(c.q_size, c.hidden_size, bias=c.o_bias, fuse_bias=plan.fused_bias, **new)
            self.gate_up_proj = Linear(c.hidden_size, {"gate_proj": c.intermediate_size,
                                                       "up_proj": c.intermediate_size},
                                       bias=c.mlp_bias, fuse_bias=plan.fused_bias, **new)
            self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias, fuse_bias=plan.fused_bias,
                                    **new)
            heads = (c.num_heads, c.num_kv_heads)
        else:
            q = (*tp.split(c.q_size), c.q_size)  # (start, stop, full) rows of the checkpoint tensors
            i = (*tp.split(c.intermediate_size), c.intermediate_size)
            k0, k1 = tp.shared(c.num_kv_heads)
            kv = (k0 * c.head_dim, k1 * c.head_dim, c.kv_size)
            self.qkv_proj = ColumnParallelLinear(c.hidden_size, {"q_proj": q, "k_proj": kv, "v_proj": kv},
                                                 bias=c.qkv_bias, fuse_bias=plan.fused_bias, **new)
            self.o_proj = RowParallelLinear(q, c.hidden_size, bias=c.o_bias, **new)
            self.gate_up_proj = ColumnParallelLinear(c.hidden_size, {"gate_proj": i, "up_proj": i}, bias=c.mlp_bias,
                                                     fuse_bias=plan.fused_bias, **new)
            self.down_proj = RowParallelLinear(i, c.hidden_size, bias=c.mlp_bias, **new)
            heads = (c.num_heads // tp.size, k1 - k0)
        self.qk_norm = (QKNorm(*heads, c.head_dim, c.rms_norm_eps, fused=plan.fused_qk_norm, **new)
                        if c.qk_norm else None)
        self.attn = attn
        self.kv = (*heads, c.head_dim)
        self.attn_out_norm: RMSNorm | None = None
        self.mlp_out_norm: RMSNorm | None = None
        self.fused_rope = plan.fused_qk_norm_rope  # q/k norms and RoPE in one fused_qk_norm_rope
        self.fused_swiglu = plan.fused_swiglu  # the gate/up projection and SiLU-and-multiply in one gemm_swiglu
        # the o and down projections with the residual add and the next norm, each one gemm_add_rms_norm
        self.fused_add_norm = fused_add_norm(plan, type(self))
        # each norm in the prologue of the projection after it (rms_norm_gemm), o and down adding the residual as c
        self.prologue_norm = prologue_norm(plan, type(self))

    def norms(self, prefix: str) -> dict[str, torch.Tensor]:
        """Checkpoint name -> weight of each norm of the layer."""
        return {f"{prefix}.input_layernorm.weight": self.input_layernorm.weight,
                f"{prefix}.post_attention_layernorm.weight": self.post_attention_layernorm.weight}

    def targets(self, prefix: str) -> dict[str, torch.Tensor | Shard]:
        """Checkpoint name -> the view (or, split across ranks, the `Shard`) each of the layer's tensors loads into."""
        out: dict[str, torch.Tensor | Shard] = dict(self.norms(prefix))
        out.update(self.qkv_proj.targets(f"{prefix}.self_attn"))
        out.update(self.o_proj.targets(f"{prefix}.self_attn.o_proj"))
        if self.qk_norm is not None:
            out[f"{prefix}.self_attn.q_norm.weight"] = self.qk_norm.q_weight
            out[f"{prefix}.self_attn.k_norm.weight"] = self.qk_norm.k_weight
        out.update(self.gate_up_proj.targets(f"{prefix}.mlp"))
        out.update(self.down_proj.targets(f"{prefix}.mlp.down_proj"))
        return out

    def attention(self, positions: torch.Tensor, hidden: torch.Tensor, rope: RotaryEmbedding,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """The attention sub-block over normed `hidden` ``[T, hidden]``: qkv, q/k norms, RoPE, attention, o_proj."""
        return self.o_proj(self.attend(positions, hidden, rope, k_cache, v_cache, ctx))

    def attend(self, positions: torch.Tensor, hidden: torch.Tensor, rope: RotaryEmbedding,
               k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """`attention` without o_proj: the heads' outputs ``[T, Hq * D]``."""
        return self.attend_qkv(positions, self.qkv_proj(hidden), rope, k_cache, v_cache, ctx)

    def attend_qkv(self, positions: torch.Tensor, qkv: torch.Tensor, rope: RotaryEmbedding,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """`attend` from the packed projection `qkv` ``[T, (Hq + 2 Hkv) * D]``: q/k norms, RoPE, attention."""
        hq, hkv, d = self.kv
        if self.qk_norm is not None and self.fused_rope:
            q, k, v = rope.with_qk_norm(positions, qkv, self.qk_norm)
        else:
            if self.qk_norm is not None:
                q, k, v = self.qk_norm(qkv)
            else:
                q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
                q, k, v = q.view(-1, hq, d), k.view(-1, hkv, d), v.view(-1, hkv, d)
            q, k = rope(positions, q, k)
        return self.attn(q, k, v, k_cache, v_cache, ctx)

    def mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        """The MLP sub-block over normed `hidden`: ``down(silu(gate) * up)``."""
        return self.down_proj(self.activation(hidden))

    def activation(self, hidden: torch.Tensor) -> torch.Tensor:
        """`mlp` without down_proj: ``silu(gate) * up`` ``[T, intermediate]``."""
        if self.fused_swiglu:
            return gemm_swiglu(hidden, self.gate_up_proj.weight, self.gate_up_proj.bias)
        return silu_and_mul(self.gate_up_proj(hidden))

    def prologue(self, positions: torch.Tensor, stream: torch.Tensor, rope: RotaryEmbedding, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """The layer on the residual stream ``[T, hidden]`` with each norm in the next projection's prologue: four
        operator calls beside the attention's (`rms_norm_gemm` twice, `gemm` with ``c`` twice); returns the new
        stream (a new tensor: the Gemm's ``c`` is read, not written)."""
        norm, qkv_proj = self.input_layernorm, self.qkv_proj
        qkv = rms_norm_gemm(stream, norm.weight, qkv_proj.weight, norm.eps, bias=qkv_proj.bias)
        attended = self.attend_qkv(positions, qkv, rope, k_cache, v_cache, ctx)
        stream = gemm(attended, self.o_proj.weight, c=stream, bias=self.o_proj.bias, beta=1.0, trans_b=True)
        norm, gate_up = self.post_attention_layernorm, self.gate_up_proj
        act = rms_norm_gemm(stream, norm.weight, gate_up.weight, norm.eps, bias=gate_up.bias, swiglu=True)
        return gemm(act, self.down_proj.weight, c=stream, bias=self.down_proj.bias, beta=1.0, trans_b=True)

    def __call__(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, rope: RotaryEmbedding,
        k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttnContext, next_norm: RMSNorm,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hidden, residual)`` after the layer; the residual sum is deferred to the next norm (None: first layer).

        With `fused_add_norm`, a `hidden` that comes with a residual is already this layer's input norm of it (the
        previous layer's down projection ran it), and the returned hidden is `next_norm` (the next layer's input
        norm, or the model's final one) of the returned residual; otherwise `next_norm` is not used. With
        `prologue_norm`, `hidden` is the residual stream itself (`residual` None), and so is the returned hidden
        (the returned residual None)."""
        if self.prologue_norm:
            return self.prologue(positions, hidden, rope, k_cache, v_cache, ctx), None
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        elif not self.fused_add_norm:
            hidden, residual = self.input_layernorm.add_norm(hidden, residual)
        if self.fused_add_norm:
            attended = self.attend(positions, hidden, rope, k_cache, v_cache, ctx)
            hidden, residual = self.post_attention_layernorm.project_add_norm(self.o_proj, attended, residual)
            return next_norm.project_add_norm(self.down_proj, self.activation(hidden), residual)
        hidden = self.attention(positions, hidden, rope, k_cache, v_cache, ctx)
        if self.attn_out_norm is not None:
            hidden = self.attn_out_norm(hidden)
        hidden, residual = self.post_attention_layernorm.add_norm(hidden, residual)
        hidden = self.mlp(hidden)
        return (hidden if self.mlp_out_norm is None else self.mlp_out_norm(hidden)), residual


def prologue_norm(plan: GatePlan, layer: type[DecoderLayer]) -> bool:
    """Whether layers of class `layer` fold each norm into the next projection's prologue (`rms_norm_gemm`) and add
    the o and down projections into the residual stream as the Gemm's ``c``: the plan says so, the model runs in
    one process, and the layer has no norm between a sub-block and its residual add (`DecoderLayer.fuses_add_norm`)."""
    return plan.prologue_norm and plan.parallel is None and layer.fuses_add_norm


def fused_add_norm(plan: GatePlan, layer: type[DecoderLayer]) -> bool:
    """Whether layers of class `layer` run their o and down projections with the residual add and the next norm
    (`gemm_add_rms_norm`): the plan fuses them, the model runs in one process (a row-parallel projection
    all-reduces before its add), and the layer fuses (`DecoderLayer.fuses_add_norm`)."""
    return plan.fused_add_norm and plan.parallel is None and layer.fuses_add_norm


class SandwichLayer(DecoderLayer):
    """`DecoderLayer` with a norm after the attention (`attn_out_norm`) and after the MLP (`mlp_out_norm`) too,
    each before its residual add: ``h = x + attn_out_norm(attn(input_layernorm(x)))``, then
    ``h + mlp_out_norm(mlp(post_attention_layernorm(h)))``.

    `NORM_NAMES` maps each norm attribute to its checkpoint name (the families name them differently).
    """

    __slots__ = ()
    NORM_NAMES: ClassVar[tuple[tuple[str, str], ...]] = ()
    fuses_add_norm: ClassVar[bool] = False  # each sub-block's output is normed before its residual add

    def __init__(self, c: ModelConfig, plan: GatePlan, attn: Attention, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__(c, plan, attn, dtype, device)
        self.attn_out_norm = self.norm_class(c.hidden_size, c.rms_norm_eps, dtype=dtype, device=device)
        self.mlp_out_norm = self.norm_class(c.hidden_size, c.rms_norm_eps, dtype=dtype, device=device)

    def norms(self, prefix: str) -> dict[str, torch.Tensor]:
        """The four norms, under the checkpoint names of `NORM_NAMES`."""
        return {f"{prefix}.{name}.weight": getattr(self, attr).weight for attr, name in self.NORM_NAMES}


class DecoderModel:
    """A causal LM: ``forward`` gives hidden states ``[T, H]``, ``logits`` the LM head's ``[B, V]``."""

    layer_class: ClassVar[type[DecoderLayer]] = DecoderLayer

    def __init__(self, config: ModelConfig, plan: GatePlan, *, dtype: torch.dtype, device: torch.device,
                 max_len: int) -> None:
        self.config = config
        tp = plan.parallel
        local = config if tp is None else tp.local_config(config)  # this rank's heads
        self.embed: Embedding | VocabParallelEmbedding
        self.lm_head: LMHead | ParallelLMHead
        if tp is None:
            self.embed = Embedding(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        else:
            self.embed = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp, dtype=dtype, device=device)
        self.layers = [self.layer_class(config, plan, self.attention(local, i), dtype, device)
                       for i in range(config.num_layers)]
        self.norm = self.layer_class.norm_class(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)
        if tp is None:
            head = self.embed.weight if config.tie_word_embeddings else torch.empty_like(self.embed.weight)
            self.lm_head = LMHead(head)
        else:  # zero padding rows, as the embedding's
            head = self.embed.weight if config.tie_word_embeddings else torch.zeros_like(self.embed.weight)
            self.lm_head = ParallelLMHead(head, config.vocab_size, tp)
        self.rope = self.rotary(config, max_len, dtype, device)
        # the layers pass the residual stream on, and the final norm runs in the LM head's prologue (`logits`)
        self.prologue_norm = bool(self.layers) and self.layers[-1].prologue_norm

    def attention(self, config: ModelConfig, index: int) -> Attention:
        """The attention of layer `index`: causal over every key, scale ``head_dim**-0.5``. `config` holds the heads
        of this rank (`TensorParallel.local_config`) when the model is split across ranks."""
        return Attention(config.num_heads, config.num_kv_heads, config.head_dim)

    def rotary(self, config: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device) -> RotaryEmbedding:
        """The RoPE tables of positions ``0 .. max_len - 1`` (rotate-half over the whole head)."""
        return RotaryEmbedding(config, max_len, dtype=dtype, device=device)

    def targets(self) -> dict[str, torch.Tensor | Shard]:
        """Every checkpoint tensor name the model loads -> the view (or this rank's `Shard`) it loads into."""
        out: dict[str, torch.Tensor | Shard] = {"model.embed_tokens.weight": self.embed.target(),
                                                "model.norm.weight": self.norm.weight}
        for i, layer in enumerate(self.layers):
            out.update(layer.targets(f"model.layers.{i}"))
        if not self.config.tie_word_embeddings:
            out["lm_head.weight"] = self.lm_head.target()
        return out

    @staticmethod
    def ignored(name: str, tied: bool) -> bool:
        """Checkpoint tensors that may be present and are not loaded: RoPE buffers, a tied head's copy."""
        return name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight")

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids int64 ``[T]`` -> embeddings ``[T, H]``."""
        return self.embed(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttnContext,
                cache: PagedKV) -> torch.Tensor:
        """input_ids, positions int64 ``[T]`` -> final hidden states ``[T, H]``."""
        hidden, residual = self.embed_tokens(input_ids), None
        layers = self.layers
        for i, layer in enumerate(layers):
            following = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.norm
            hidden, residual = layer(positions, hidden, residual, self.rope, cache.keys[i], cache.values[i], ctx,
                                     following)
        if layers and layers[-1].fused_add_norm:  # the last down projection ran the final norm
            return hidden
        if self.prologue_norm:  # the residual stream: `logits` runs the final norm in the LM head's prologue
            return hidden
        return self.norm.add_norm(hidden, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[B, H]`` -> logits ``[B, V]`` in the model dtype (with `prologue_norm`, `hidden` is the residual
        stream and the final norm runs in the head's `rms_norm_gemm`)."""
        if self.prologue_norm:
            return rms_norm_gemm(hidden, self.norm.weight, self.lm_head.weight, self.norm.eps)
        return self.lm_head(hidden)
