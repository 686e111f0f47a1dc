"""A model's shapes as the memory estimate (``easyr1/memory.py``) counts them: sizes read from its
config (``config.json``, or a named size such as ``qwen2:7b``; the weights are never read), and the
bytes per token a decoder block keeps for backward or holds in a forward pass."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from easyr1.models.structure import vision_tower

# What a decoder block does with its activations in the update, from the most memory kept to the
# least (``models.recompute`` applies them; ``activations.RecomputePlan`` chooses them per block).
KEEP, POINTWISE, ATTENTION, FULL = "keep", "pointwise", "attention", "full"
RECOMPUTE_MODES = (KEEP, POINTWISE, ATTENTION, FULL)


@dataclass(frozen=True)
class Architecture:
    """The shapes the estimate needs, read from a model's config."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    params: int  # every parameter
    vision_params: int  # of those, the vision tower's
    # LoRA-adaptable linear layers (name, in features, out features), the output head excluded.
    linears: tuple[tuple[str, int, int], ...] = field(repr=False, default=())

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def block_params(self) -> float:
        """One decoder block's parameters (the non-embedding text parameters over the layers)."""
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return (self.params - self.vision_params - embeddings) / self.layers

    @classmethod
    def from_config(cls, config: Any) -> Architecture:
        """Counts from the model built on the meta device: shapes only, nothing allocated."""
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        text = getattr(config, "text_config", None) or config
        auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
        with torch.device("meta"):
            model = auto.from_config(config)
        output = model.get_output_embeddings()
        vision = vision_tower(model)
        linears = tuple(
            (name, module.in_features, module.out_features)
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not output
        )
        heads = text.num_attention_heads
        return cls(
            hidden=text.hidden_size,
            intermediate=text.intermediate_size,
            layers=text.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            vocab=text.vocab_size,
            tied=bool(getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False))),
            params=sum(p.numel() for p in model.parameters()),
            vision_params=sum(p.numel() for p in vision.parameters()) if vision is not None else 0,
            linears=linears,
        )

    @classmethod
    def load(cls, model: str) -> Architecture:
        """``model``: a model folder (its ``config.json``) or a named size, ``ARCH:SIZE`` (``qwen2:7b``:
        the Qwen2.5 sizes that ``easyr1 tiny-model --size`` builds)."""
        from transformers import AutoConfig

        if Path(model).is_dir():
            return cls.from_config(AutoConfig.from_pretrained(model))
        from easyr1.models.tiny import SIZES, model_config
        from easyr1.models.tokenizer import build_tokenizer

        arch, _, size = model.partition(":")
        if (arch, size) not in SIZES:
            named = ", ".join(f"{a}:{s}" for a, s in SIZES)
            raise ValueError(f"{model!r} is neither a model folder nor a named size ({named})")
        tokenizer = build_tokenizer("llama3" if arch == "llama" else "qwen")
        return cls.from_config(AutoConfig.for_model(**model_config(arch, tokenizer, size)))

    def lora_params(self, rank: int, target_modules: str, exclude_modules: str | None) -> int:
        """Adapter parameters, rank x (in + out) per adapted linear layer, as peft chooses them:
        every linear layer but the output head (``all-linear``) or those whose name ends with a
        listed one, minus those whose full name matches ``exclude_modules``."""
        names = (
            None
            if target_modules == "all-linear"
            else [n.strip() for n in target_modules.split(",") if n.strip()]
        )
        return sum(
            rank * (fan_in + fan_out)
            for name, fan_in, fan_out in self.linears
            if (names is None or any(name == n or name.endswith("." + n) for n in names))
            and not (exclude_modules and re.fullmatch(exclude_modules, name))
        )

    def activation_bytes(self) -> int:
        """Bytes per token one decoder block keeps for its backward pass (bf16 compute, padding-free
        attention: no sequence-squared term), as measured tensor by tensor on CPU
        (tests/engine/test_memory.py): each RMSNorm its float32 input (4h), its normalised value and its
        output in bf16 (2h + 2h), two of them; v (2kv); q and k after rotary (2(q + kv)); the
        attention output (2q) and its log-sum-exp (4 per head); the MLP's gate, up, activation and
        product (8i). A compiled block keeps less (``COMPILED_ACTIVATIONS``)."""
        return 16 * self.hidden + 4 * self.q + 4 * self.kv + 8 * self.intermediate + 4 * self.heads

    def partial_recompute_bytes(self, mode: str) -> int:
        """Bytes per token a compiled block of a partial recompute mode keeps besides its input,
        measured tensor by tensor on CPU (tests/engine/test_recompute.py): ``pointwise``, the q
        projection and the attention output (4q), k and v (4kv), the log-sum-exp (4 per head), the o
        projection (2h: the MLP's input is recomputed from it) and the MLP's gate and up (4i);
        ``attention``, the gate and up alone."""
        if mode == POINTWISE:
            return 2 * self.hidden + 4 * self.q + 4 * self.kv + 4 * self.intermediate + 4 * self.heads
        if mode == ATTENTION:
            return 4 * self.intermediate
        raise ValueError(f"{mode!r} is not a partial recompute mode ({POINTWISE}, {ATTENTION})")

    def recompute_flops(self, mode: str, sequence: float) -> float:
        """Forward FLOPs per token a block of ``mode`` does again in backward, for sequences of
        ``sequence`` tokens (causal attention: each token attends to half of its sequence on average).
        ``full`` stops once the MLP's down projection's input exists (torch's checkpoint stops early),
        ``attention`` redoes the q, k, v and o projections and the kernel, ``pointwise`` no matmul."""
        h, q, kv, i = self.hidden, self.q, self.kv, self.intermediate
        projections = 2 * h * (2 * q + 2 * kv)
        kernel = 2 * 2 * (sequence / 2) * q  # scores and their product with v
        if mode == ATTENTION:
            return projections + kernel
        if mode == FULL:
            return projections + kernel + 2 * 2 * h * i
        return 0.0

    def forward_bytes(self, compiled: bool = False) -> int:
        """Bytes per token a block's forward pass holds at once without autograd, in bf16: the
        hidden states it was called with (2h, the caller keeps them), and at its peak, in the MLP,
        the residual and the normalised input (4h) beside the gate's activation, the up projection
        and their product (6i). Measured tensor by tensor on CPU (tests/engine/test_memory.py); the
        attention's and the norms' moments are smaller. ``compiled``: inductor fuses the activation
        with the product and writes it over the gate's output, a buffer it frees there (4i); inferred
        from the GPU records, not measured tensor by tensor (inductor's buffers bypass dispatch): the
        3B one-GPU reference pass held 0.61 GiB in flight, 0.89 by the eager count, 0.72 by this one."""
        return 6 * self.hidden + (4 if compiled else 6) * self.intermediate
