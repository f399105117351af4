"""The one model skeleton every family is: embed → layers → last-token select → final norm →
head, over one per-forward context.

A family is a config (radixkv.model.config.ModelConfig subclass), its layer classes and a
`DecoderLM` subclass naming them and its hooks: `make_layer` (or `layer_cls`), `prepare` (the
per-forward derived tensors its layers read, as one typed object: RoPE tables, state metadata),
and class attributes for the final norm. Embedding scale, attention scale, final soft-capping
and per-layer windows come from the config.

Layers are called as `layer(x, fwd)` with `fwd` the `Forward` of this step. The standard
layer, `DecoderLayer` (pre-norm RMSNorm → attention → residual, RMSNorm → SiLU MLP →
residual, reading `Rope` tables), also declares that it can run stacked: when every layer of a
model is stackable, the skeleton runs them through the native C++ stack
(radixkv.model.nn.native_stack) where it serves the forward, or through torch.compile
(radixkv.model.nn.compiled) once `compile()` was called — whatever the family. Any other layer
runs eagerly. The contract with the engine is ForwardBatch plus its pools (a
`memory.hybrid.ModelPools` from `config.pool_spec()`, or a bare KVPool for a one-component
attention-only model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from radixkv.memory.hybrid import ModelPools
from radixkv.memory.pool import KVPool
from radixkv.model.attention import (
    AttentionBackend,
    AttnLayer,
    KVStep,
    TorchAttention,
    kv_components,
)
from radixkv.model.batch import ForwardBatch
from radixkv.model.config import ModelConfig, kind_indices
from radixkv.model.nn.blocks import (
    NORMS,
    Attention,
    AttentionSpec,
    GatedMLP,
    LayerOps,
    WeightGetter,
    Weights,
)
from radixkv.model.nn.layers import rms_norm
from radixkv.model.nn.linear import PackedLinear
from radixkv.model.nn.native_stack import NativeLayer, NativeStack

if TYPE_CHECKING:
    from radixkv.model.nn.compiled import CompiledStack

P = TypeVar("P")


@dataclass(frozen=True)
class Rope:
    """RoPE cos/sin tables [T, rotary dim] of this step's positions (what standard layers read)."""

    cos: torch.Tensor
    sin: torch.Tensor


@dataclass(frozen=True)
class Forward(Generic[P]):
    """Everything a layer reads in one forward, built once by `DecoderLM.forward`: the batch,
    attention over the KV components (`kv`, also the eager LayerOps), the pools (None when the
    model was handed a bare KVPool) and the family's derived tensors (`prep`, from `prepare`)."""

    batch: ForwardBatch
    kv: KVStep
    pools: ModelPools | None
    prep: P

    @property
    def positions(self) -> torch.Tensor:
        return self.batch.positions


class DecoderLayer(nn.Module):
    """The standard pre-norm block: attention with the KV pools, then a gated MLP (SiLU unless
    `act` says otherwise), RMSNorm before each. `stackable`: the native and compiled stacks
    compute it exactly as `block` does; a subclass that overrides `block` or `forward` is not
    stackable unless it says so."""

    stackable: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "stackable" not in cls.__dict__ and ({"block", "forward"} & set(cls.__dict__)):
            cls.stackable = False

    def __init__(
        self,
        spec: AttentionSpec,
        index: int,
        w: Weights,
        window: int | None = None,
        mlp_bias: bool = False,
        act: str = "silu",
    ) -> None:
        super().__init__()
        self.index = index
        self.window = window
        self.eps = spec.eps
        self.input_norm = w.need("input_layernorm.weight")
        self.post_norm = w.need("post_attention_layernorm.weight")
        self.attn = Attention(spec, index, w.sub("self_attn."))
        self.mlp = GatedMLP(w.sub("mlp."), act=act, bias=mlp_bias)

    def forward(self, x: torch.Tensor, fwd: Forward[Rope]) -> torch.Tensor:
        return self.block(x, fwd.prep.cos, fwd.prep.sin, fwd.kv)

    def native_layer(self) -> NativeLayer | None:
        """This block as the native C++ stack computes it (None where it is not stackable)."""
        if not type(self).stackable:
            return None
        return NativeLayer(self.attn, self.mlp, self.eps, self.input_norm, self.post_norm)

    def block(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: LayerOps
    ) -> torch.Tensor:
        """x [T, hidden] → x after this block. `ops` supplies the linear and attention calls
        (eager, or custom ops when traced by the compiler); everything else is a custom op or
        element-wise torch (residual adds, casts)."""
        x = x + self.attn(rms_norm(x, self.input_norm, self.eps), cos, sin, ops)
        return x + self.mlp(rms_norm(x, self.post_norm, self.eps), ops)


def is_stackable(layer: nn.Module) -> bool:
    """Whether `layer` declares that the native and compiled stacks compute it."""
    return isinstance(layer, DecoderLayer) and type(layer).stackable


class DecoderLM(nn.Module, Generic[P]):
    """`model(batch, pools)` → float32 logits: [R, vocab] (each request's last new token) or
    [T, vocab] when `batch.return_all_logits`. Subclasses set `layer_cls` (built as
    `layer_cls(cfg, index, weights)`) or override `make_layer`, implement `prepare`, and may set
    `final_norm_weight` / `final_norm_kind` (a blocks.NORMS key). The head is a PackedLinear
    (the row-invariant GEMM where it serves), tied to the embedding unless the checkpoint has
    its own."""

    layer_cls: ClassVar[Any] = None
    final_norm_weight: ClassVar[str] = "model.norm.weight"
    final_norm_kind: ClassVar[str] = "rms"

    def __init__(
        self,
        cfg: ModelConfig,
        get: WeightGetter,
        device: str = "cpu",
        attention: AttentionBackend | None = None,
    ) -> None:
        super().__init__()
        self.config = cfg
        self.pool_spec = cfg.pool_spec()
        self.attention: AttentionBackend = attention or TorchAttention()
        w = Weights(get)
        self.embed = w.need("model.embed_tokens.weight")
        self.layers = nn.ModuleList(
            self.make_layer(cfg, i, w.sub(f"model.layers.{i}.")) for i in range(cfg.num_layers)
        )
        self.norm = w.need(self.final_norm_weight)
        self._final_norm = NORMS[self.final_norm_kind]
        head = None if cfg.tie_word_embeddings else w.maybe("lm_head.weight")
        # Tied checkpoints (or ones that omit lm_head) share the embedding matrix; the head is
        # a packed copy (the embedding lookup needs the plain matrix).
        self.lm_head = self.embed if head is None else head
        self.head = PackedLinear(self.lm_head.detach())
        self.embed_scale = cfg.embed_scale
        self.final_softcap = cfg.final_softcap
        self.attn_layers = self.make_attn_layers()
        self.stackable = len(self.layers) > 0 and all(is_stackable(x) for x in self.layers)
        self.compiled: CompiledStack | None = None
        self._native: NativeStack | bool | None = True  # True: not built yet

    def make_layer(self, cfg: ModelConfig, index: int, w: Weights) -> nn.Module:
        """Layer `index` of the model, its weights under `w` (model.layers.{index}.)."""
        if self.layer_cls is None:
            raise NotImplementedError(f"{type(self).__name__} sets no layer_cls")
        layer: nn.Module = self.layer_cls(cfg, index, w)
        return layer

    def make_attn_layers(self) -> dict[int, AttnLayer]:
        """Each attention layer's component, pool layer, window and scale."""
        cfg = self.config
        kinds = cfg.layer_kinds
        return {
            i: AttnLayer(kind, j, cfg.layer_window(i), cfg.attn_scale)
            for i, (kind, j) in enumerate(zip(kinds, kind_indices(kinds), strict=True))
            if kind != "state"
        }

    def prepare(self, batch: ForwardBatch, pools: ModelPools | None) -> P:
        """Family hook: the per-forward tensors its layers read (RoPE tables, state metadata)."""
        raise NotImplementedError

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def supports_compile(self) -> bool:
        """Whether `compile` runs the layers compiled (every layer stackable)."""
        return self.stackable

    def why_not_compiled(self) -> str | None:
        """None when `compile` runs the layers compiled (every layer stackable, whatever the
        model's KV kinds), else why it keeps its layers eager."""
        if self.stackable:
            return None
        names = sorted({type(x).__name__ for x in self.layers if not is_stackable(x)})
        state = self.config.count("state")
        kinds = f" ({state} of {len(self.layers)} are state layers)" if state else ""
        return (
            f"{self.config.architecture}: its {', '.join(names) or 'no'} layers{kinds} are not "
            "the skeleton's standard DecoderLayer, the only layer the compiled stack runs"
        )

    def compile(self) -> None:
        """Run the layer stack through torch.compile from now on (see radixkv.model.nn.compiled);
        the eager layers where they are not all stackable. Idempotent: a model shared by several
        engines is compiled once."""
        from radixkv.model.nn.compiled import CompiledStack

        if self.compiled is None and self.stackable:
            self.compiled = CompiledStack(cast(list[DecoderLayer], list(self.layers)))

    def native_stack(self) -> NativeStack | None:
        """The layers as one C++ call (radixkv.model.nn.native_stack), built on first use; None
        where it cannot serve this model."""
        if self._native is True:
            self._native = NativeStack.of(self)
        return self._native if isinstance(self._native, NativeStack) else None

    def context(self, batch: ForwardBatch, pools: KVPool | ModelPools) -> Forward[P]:
        """This step's `Forward`: attention metadata per KV component, prepared once, and the
        family's derived tensors."""
        model_pools = pools if isinstance(pools, ModelPools) else None
        spec = self.pool_spec
        if model_pools is None and (len(spec.kinds) > 1 or spec.kinds != spec.attention_kinds):
            # a bare KVPool serves a model of one attention kind and nothing else
            raise TypeError(f"{self.config.architecture} needs ModelPools (memory.hybrid)")
        components = kv_components(batch, pools, self.pool_spec)
        kv = KVStep(self.attention, components, self.attn_layers, batch.attention)
        return Forward(batch, kv, model_pools, self.prepare(batch, model_pools))

    def native_ropes(self, prep: P) -> dict[str, Rope] | None:
        """Each KV component's RoPE table in this step, for the native stack (None: the family's
        layers read something else). Standard layers read one table for every component."""
        if not isinstance(prep, Rope):
            return None
        return {at.kind: prep for at in self.attn_layers.values()}

    def run_layers(self, x: torch.Tensor, fwd: Forward[P]) -> torch.Tensor:
        """The layers: compiled, native or eager (see the module docstring)."""
        if self.stackable and self.compiled is not None and isinstance(fwd.prep, Rope):
            return self.compiled(x, fwd.prep.cos, fwd.prep.sin, fwd.kv)
        native = self.native_stack()
        if native is not None:
            ropes = self.native_ropes(fwd.prep)
            if ropes is not None and native.serves(x, ropes, fwd.kv):
                return native(x, ropes, fwd.kv)
        for layer in self.layers:
            x = layer(x, fwd)
        return x

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pools: KVPool | ModelPools) -> torch.Tensor:
        batch = batch.to(self.device)
        x = F.embedding(batch.input_ids, self.embed)
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        x = self.run_layers(x, self.context(batch, pools))
        if not batch.return_all_logits:
            x = x.index_select(0, batch.q_start[1:] - 1)
        logits = self.head(self._final_norm(x, self.norm, self.config.rms_norm_eps)).float()
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
