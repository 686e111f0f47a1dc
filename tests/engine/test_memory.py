"""The memory estimator (``easyr1 memory``), term by term.

Three kinds of check, each against an independent computation:
- the architecture's counts and per-token byte formulas for Qwen2.5-1.5B and -7B, written out by hand
  from the published shapes;
- ``estimate``'s terms for EasyR1's example workload (``easyr1.workloads.workload_config``) under BF16, AMP
  and LoRA, hand-computed from those counts;
- the terms that exist on a CPU, measured on a real tiny model: parameter, gradient and optimizer-state
  bytes, and the tensors one decoder layer saves for its backward pass.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from easyr1.activations import COMPILED_ACTIVATIONS, RecomputePlan
from easyr1.config import PPOConfig, load_config, override_value
from easyr1.memory import (
    ACTIVATIONS,
    GIB,
    IN_FLIGHT,
    SCORING_BACKWARD_CHUNKS,
    WORKSPACE,
    estimate,
    recompute_plan,
    smallest_fit,
)
from easyr1.models.architecture import Architecture
from easyr1.workers.config import LOGPROB_CHUNK_ELEMENTS
from easyr1.workloads import workload_config
from tests.block_utils import qwen2_layer_config, saved_for_backward

# ------------------------------------------------------------------ Qwen2.5-1.5B, by hand

H, FFN, L, HEADS, KV_HEADS, HEAD_DIM, V = 1536, 8960, 28, 12, 2, 128, 151936
Q, KV = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM  # 1536, 256
# q, k and v projections have biases, the output projection has none; gate, up and down; two RMSNorms.
LAYER = (H * Q + Q) + (H * KV + KV) + (H * KV + KV) + Q * H + 3 * H * FFN + 2 * H
P = V * H + L * LAYER + H  # tied embeddings (one matrix), the layers, the final norm
# LoRA: rank x (in + out) per adapted linear layer: q, k, v, o, gate, up, down.
LORA_LAYER = (H + Q) + (H + KV) + (H + KV) + (Q + H) + (H + FFN) + (H + FFN) + (FFN + H)
ADAPTERS = 64 * LORA_LAYER * L

T_UPDATE = 1 * (2048 + 2048)  # the workload's update micro-batch (1 sequence) x its prompt + response length


@pytest.fixture(scope="module")
def qwen15() -> Architecture:
    return Architecture.load("qwen2:1.5b")


def _config(precision: str = "bf16", gpus: int = 1, backend: str = "hf", **overrides: Any) -> PPOConfig:
    """EasyR1's example workload on Qwen2.5-1.5B (``easyr1_1.5b``) with ``overrides`` (dots as ``__``)."""
    values = {
        **workload_config("easyr1_1.5b", backend, gpus, precision),
        **{k.replace("__", "."): v for k, v in overrides.items()},
    }
    args = [f"{k}={override_value(v)}" for k, v in values.items()]
    return load_config(args + ["data.train_files=x", "worker.actor.model.model_path=x"])


# ------------------------------------------------------------------ the architecture


def test_qwen2_5_1_5b_shapes_and_parameter_count(qwen15: Architecture) -> None:
    a = qwen15
    shapes = (a.hidden, a.intermediate, a.layers, a.heads, a.kv_heads, a.head_dim, a.vocab)
    assert shapes == (H, FFN, L, HEADS, KV_HEADS, HEAD_DIM, V)
    assert (a.q, a.kv, a.tied, a.vision_params) == (Q, KV, True, 0)
    assert P == 1_543_714_304  # the published count
    assert a.params == P


def test_block_params_are_the_non_embedding_parameters_over_the_layers(qwen15: Architecture) -> None:
    # Documented as (params - embeddings) / layers: one layer plus its 1/L share of the final norm.
    assert qwen15.block_params == pytest.approx((L * LAYER + H) / L, rel=1e-15)
    assert qwen15.block_params - LAYER == pytest.approx(H / L)


def test_qwen2_5_7b_is_untied() -> None:
    a = Architecture.load("qwen2:7b")
    h, i, layers, q, kv, vocab = 3584, 18944, 28, 28 * 128, 4 * 128, 152064
    layer = (h * q + q) + 2 * (h * kv + kv) + q * h + 3 * h * i + 2 * h
    expected = 2 * vocab * h + layers * layer + h  # separate input and output embeddings
    assert expected == 7_615_616_512
    assert a.params == expected and not a.tied
    assert a.block_params == pytest.approx(layer + h / layers, rel=1e-15)


def test_qwen2_5_vl_7b_is_untied_with_its_vision_tower() -> None:
    """The EasyR1-scale VL workload's architecture: Qwen2.5-VL-7B's published 8.29 B parameters, of
    which the 32-block vision tower and its merger into the 3584-wide text model hold 0.68 B."""
    a = Architecture.load("qwen2_5_vl:7b")
    assert a.params == 8_292_166_656 and not a.tied
    assert (a.hidden, a.layers, a.heads, a.kv_heads, a.vocab) == (3584, 28, 28, 4, 152064)
    assert a.vision_params == 8_292_166_656 - 7_615_616_512  # the rest is Qwen2.5-7B's text model


def test_qwen3_4b_has_its_published_counts() -> None:
    """Qwen3-4B: 4.0 B parameters, 3.6 B without the (tied) embedding; q/k norms of head_dim 128."""
    a = Architecture.load("qwen3:4b")
    h, i, layers, q, kv, head_dim, vocab = 2560, 9728, 36, 32 * 128, 8 * 128, 128, 151936
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * head_dim  # no biases; q_norm and k_norm
    assert layers * layer + h == 3_633_511_936 and a.params == vocab * h + 3_633_511_936 and a.tied
    assert (a.head_dim, a.heads, a.kv_heads) == (128, 32, 8)


@pytest.mark.parametrize(
    "vl, text, published",
    [("qwen2_5_vl:32b", "qwen2:32b", 33.5e9), ("qwen3_vl:4b", "qwen3:4b", 4.44e9)],
)
def test_vision_language_sizes_are_their_text_model_and_a_vision_tower(
    vl: str, text: str, published: float
) -> None:
    """The examples' VL architectures: the language model is the text family's at that size, and the
    whole has the published count (Qwen2.5-VL-32B 33.5 B, Qwen3-VL-4B 4.44 B) to its last digit shown."""
    a, t = Architecture.load(vl), Architecture.load(text)
    assert a.params - a.vision_params == t.params and a.tied == t.tied
    assert round(a.params / 1e9, 2 if published < 1e10 else 1) == published / 1e9


def test_lora_adapter_counts(qwen15: Architecture) -> None:
    assert ADAPTERS == 73_859_072
    assert qwen15.lora_params(64, "all-linear", None) == ADAPTERS  # the output head is never adapted
    assert qwen15.lora_params(64, "q_proj,v_proj", None) == 64 * ((H + Q) + (H + KV)) * L == 8_716_288
    # Spaces after the commas, another rank.
    assert qwen15.lora_params(8, "q_proj, v_proj", None) == 8 * ((H + Q) + (H + KV)) * L
    # exclude_modules: a regular expression on the full name; here every linear layer of block 0.
    assert qwen15.lora_params(64, "all-linear", r"model\.layers\.0\..*") == 64 * LORA_LAYER * (L - 1)


def test_per_token_byte_formulas(qwen15: Architecture) -> None:
    # activation_bytes, its documented terms one by one: two RMSNorms (float32 input 4h, bf16
    # normalised value 2h, bf16 output 2h), v, q and k after rotary, the attention output and its
    # log-sum-exp (4 bytes per head), the MLP.
    norms = 2 * (4 * H + 2 * H + 2 * H)
    attention = 2 * KV + 2 * (Q + KV) + 2 * Q + 4 * 12
    mlp = 2 * FFN * 4  # gate, up, activation, product
    assert qwen15.activation_bytes() == norms + attention + mlp == 103_472
    # forward_bytes: the block's input, then at the MLP the residual and the normalised input beside
    # the activation, the up projection and their product, all bf16.
    assert qwen15.forward_bytes() == 2 * H + 2 * (H + H) + 2 * 3 * FFN == 62_976


# ------------------------------------------------------------------ estimate(): the models' terms


@pytest.mark.parametrize("gpus", [1, 4])
@pytest.mark.parametrize(
    ("precision", "params", "grads", "optimizer"),
    [
        ("bf16", 2 * P, 2 * P, 6 * P),  # bf16 weights, gradients, Adam's two moments + the Kahan buffer
        ("amp", 4 * P, 4 * P, 8 * P),  # fp32 master weights and gradients, fp32 moments
        ("lora", 4 * (P + ADAPTERS), 4 * ADAPTERS, 8 * ADAPTERS),  # AMP; only the adapters train
    ],
)
def test_actor_terms_by_precision(
    qwen15: Architecture, precision: str, params: int, grads: int, optimizer: int, gpus: int
) -> None:
    result = estimate(_config(precision, gpus), qwen15, gpus=gpus)
    update = result.phases["update_actor"]
    assert update["actor parameters"] == params / gpus  # FSDP shards over every GPU
    assert update["actor gradients"] == grads / gpus
    assert update["actor optimizer state"] == optimizer / gpus


def test_offloaded_actor_is_on_the_device_only_for_its_update(qwen15: Architecture) -> None:
    # The workload offloads the actor's parameters and optimizer state between phases. With vLLM the
    # rollout never touches the actor; the experience phase scores only the reference (on-policy, KL loss).
    offloaded = estimate(_config("bf16", backend="vllm"), qwen15, gpus=1, gpu_memory_gib=80).phases
    for phase in ("rollout", "experience"):
        assert (
            "actor parameters" not in offloaded[phase] and "actor optimizer state" not in offloaded[phase]
        ), phase
    assert offloaded["update_actor"]["actor parameters"] == 2 * P
    assert offloaded["update_actor"]["actor optimizer state"] == 6 * P

    kept = _config(
        "bf16",
        backend="vllm",
        worker__actor__offload__offload_params=False,
        worker__actor__offload__offload_optimizer=False,
    )
    resident = estimate(kept, qwen15, gpus=1, gpu_memory_gib=80).phases
    for phase in ("rollout", "experience", "update_actor"):
        assert resident[phase]["actor parameters"] == 2 * P, phase
        assert resident[phase]["actor optimizer state"] == 6 * P, phase

    # Only the parameters offloaded: the optimizer state stays everywhere, the parameters do not.
    half = estimate(
        _config("bf16", backend="vllm", worker__actor__offload__offload_optimizer=False),
        qwen15,
        gpus=1,
        gpu_memory_gib=80,
    )
    assert (
        "actor parameters" not in half.phases["rollout"]
        and half.phases["rollout"]["actor optimizer state"] == 6 * P
    )


def test_hf_rollout_generates_with_the_offloaded_actor(qwen15: Architecture) -> None:
    rollout = estimate(_config("bf16", backend="hf"), qwen15, gpus=1).phases["rollout"]
    assert rollout["actor parameters"] == 2 * P  # brought back to generate
    assert "actor optimizer state" not in rollout
    assert rollout["gathered actor (compute dtype)"] == 2 * P  # its shards gathered whole
    # KV cache: rollout_batch_size x n sequences of prompt + response, k and v of every layer, bf16.
    assert rollout["KV cache"] == 1 * 2 * 4096 * L * 2 * KV * 2


def test_reference_model(qwen15: Architecture) -> None:
    # The workload keeps the reference in host memory (FSDP CPU offload): never on the device.
    on_host = estimate(_config("bf16"), qwen15, gpus=1)
    assert not any(name.startswith("ref") for terms in on_host.phases.values() for name in terms)

    # On the device it is resident in every phase, bf16 (worker.ref.fsdp.torch_dtype), sharded.
    for gpus in (1, 4):
        resident = estimate(
            _config("bf16", gpus, worker__ref__fsdp__enable_cpu_offload=False), qwen15, gpus=gpus
        )
        for phase, terms in resident.phases.items():
            assert terms["ref parameters"] == 2 * P / gpus, phase
            assert "ref optimizer state" not in terms and "ref gradients" not in terms

    # With LoRA the reference is the actor with its adapters off: no second model; the experience
    # phase is the actor's forward pass, so the (offloaded) actor is on the device for it.
    lora = estimate(_config("lora", worker__ref__fsdp__enable_cpu_offload=False), qwen15, gpus=1)
    assert not any(name.startswith("ref") for terms in lora.phases.values() for name in terms)
    assert lora.phases["experience"]["actor parameters"] == 4 * (P + ADAPTERS)

    # No KL at all: no reference either.
    no_kl = estimate(
        _config("bf16", worker__ref__fsdp__enable_cpu_offload=False, algorithm__disable_kl=True),
        qwen15,
        gpus=1,
    )
    assert not any(name.startswith("ref") for terms in no_kl.phases.values() for name in terms)


def test_a_forward_pass_peaks_in_a_block_or_in_the_scoring_head(qwen15: Architecture) -> None:
    """Without autograd the blocks' intermediates are gone before the head scores, so the
    experience phase counts the larger of the two, beside the root's gathered parameters (hand
    values: the 1.5B architecture, 2 x 4,096 tokens, bf16)."""
    varying = IN_FLIGHT
    root = 2 * V * H  # tied: one matrix, gathered for the whole pass
    chunk = (LOGPROB_CHUNK_ELEMENTS // V) * V * 4  # a float32 chunk of 1,766 tokens' logits
    blocks = 2 * 2 * LAYER + 2 * 4096 * qwen15.forward_bytes()  # two gathered, one's intermediates
    eager = estimate(_config("bf16", worker__actor__use_torch_compile=False), qwen15, gpus=1).phases[
        "experience"
    ]
    assert eager["gathered root parameters"] == root
    assert eager[WORKSPACE] == 0.161 * GIB  # in every phase
    assert 4.05 * chunk > blocks and eager[varying] == pytest.approx(4.05 * chunk)  # 4.05 chunk-sized buffers
    # Compiled (on GPUs, the default), the head's elementwise work is fused: 0.54 of a chunk; the
    # blocks' product is written over the gate's output.
    terms = estimate(_config("bf16"), qwen15, gpus=1).phases["experience"]
    fused = 2 * 2 * LAYER + 2 * 4096 * qwen15.forward_bytes(compiled=True)
    assert fused < blocks and terms[varying] == pytest.approx(max(fused, 0.54 * chunk))
    head = 4.05 * chunk
    long = estimate(
        _config("bf16", data__max_prompt_length=32768, data__max_response_length=32768), qwen15, gpus=1
    )
    long_blocks = 2 * 2 * qwen15.block_params + 2 * 65536 * qwen15.forward_bytes(compiled=True)
    assert long_blocks > head and long.phases["experience"][varying] == pytest.approx(long_blocks)


# ------------------------------------------------------------------ estimate(): rollout, fit, activations


def test_vllm_takes_its_share_of_the_gpu(qwen15: Architecture) -> None:
    config = _config("bf16", backend="vllm", worker__rollout__free_cache_engine=True)
    assert config.worker.rollout.gpu_memory_utilization == 0.6
    result = estimate(config, qwen15, gpus=1, gpu_memory_gib=80)
    assert result.phases["rollout"]["vLLM (weights, KV cache; gpu_memory_utilization)"] == 0.6 * 80 * GIB
    assert not result.blockers
    # Asleep while the actor trains (free_cache_engine=true) it is in the rollout only; awake, in every phase.
    assert not any(k.startswith("vLLM") for k in result.phases["update_actor"])
    awake = estimate(
        _config("bf16", backend="vllm", worker__rollout__free_cache_engine=False),
        qwen15,
        gpus=1,
        gpu_memory_gib=80,
    )
    assert awake.phases["update_actor"]["vLLM (weights, KV cache; gpu_memory_utilization)"] == 0.6 * 80 * GIB
    # "auto" (the default) is awake where that fits with 10% to spare (66.2 of 72 GiB on 80; 51.8 of 50.4 on 56).
    auto = _config("bf16", backend="vllm")
    assert auto.worker.rollout.free_cache_engine == "auto" and awake.device / GIB <= 72
    on_80 = estimate(auto, qwen15, gpus=1, gpu_memory_gib=80)
    assert on_80.phases == awake.phases and any(
        n.startswith("free_cache_engine=auto: awake") for n in on_80.notes
    )
    on_56 = estimate(auto, qwen15, gpus=1, gpu_memory_gib=56)
    asleep = estimate(config, qwen15, gpus=1, gpu_memory_gib=56)
    assert on_56.phases == asleep.phases and any("asleep while training" in n for n in on_56.notes)

    with pytest.raises(ValueError, match="--gpu-memory"):
        estimate(config, qwen15, gpus=1)


def test_too_small_a_vllm_share_is_a_blocker(qwen15: Architecture) -> None:
    # 2% of 80 GiB is 1.6 GiB; the bf16 weights are 2P = 2.88 GiB: no room for a KV cache at any GPU size.
    small = _config("bf16", backend="vllm", worker__rollout__gpu_memory_utilization=0.02)
    result = estimate(small, qwen15, gpus=1, gpu_memory_gib=80)
    assert len(result.blockers) == 1 and "gpu_memory_utilization" in result.blockers[0]
    assert not result.fits(80) and not result.fits(10_000)
    # Split over two GPUs by tensor parallelism, 1.44 GiB of weights each fit in the 1.6 GiB share.
    split = _config("bf16", gpus=2, backend="vllm", worker__rollout__gpu_memory_utilization=0.02)
    assert split.worker.rollout.tensor_parallel_size == 2
    assert not estimate(split, qwen15, gpus=2, gpu_memory_gib=80).blockers


def test_smallest_fit_is_the_smallest_power_of_two_that_fits(qwen15: Architecture) -> None:
    config = _config("bf16")
    # From the estimate itself: 18.2 GiB on 1 GPU, 11.0 on 2, 7.4 on 4 (the sharded terms shrink).
    fit = smallest_fit(config, qwen15, 10)
    assert fit is not None and fit.gpus == 4 and fit.fits(10)
    for gpus in (1, 2):
        assert not estimate(config, qwen15, gpus=gpus, gpu_memory_gib=10).fits(10)
    assert fit.to_dict() == estimate(config, qwen15, gpus=4, gpu_memory_gib=10).to_dict()
    assert smallest_fit(config, qwen15, 80).gpus == 1
    # The unsharded terms (the scoring head's buffers, the gathered root and blocks, the activations:
    # 3.0 GiB, with the CUDA context 3.8) never fit 3 GiB.
    assert smallest_fit(config, qwen15, 3) is None
    # Nor does anything fit while vLLM's share cannot hold its weights (tensor-parallel size 1).
    assert (
        smallest_fit(
            _config("bf16", backend="vllm", worker__rollout__gpu_memory_utilization=0.02), qwen15, 80
        )
        is None
    )


@pytest.mark.parametrize("compiled", [True, False])
def test_activations_with_and_without_gradient_checkpointing(qwen15: Architecture, compiled: bool) -> None:
    # The actor's blocks compiled (EasyR1's default on GPUs) keep COMPILED_ACTIVATIONS of the eager bytes.
    layer = T_UPDATE * qwen15.activation_bytes() * (COMPILED_ACTIVATIONS if compiled else 1.0)
    # The eager scoring head's backward (its chunk buffers) runs over every block's saved activations,
    # before any block's backward; the compiled head's term stands apart.
    chunk = min(2048, LOGPROB_CHUNK_ELEMENTS // V) * V * 4
    head = 0.0 if compiled else SCORING_BACKWARD_CHUNKS * chunk
    compile_key = {"worker__actor__use_torch_compile": compiled}
    off = estimate(
        _config("bf16", worker__actor__model__enable_gradient_checkpointing=False, **compile_key),
        qwen15,
        gpus=1,
    )
    assert off.phases["update_actor"][ACTIVATIONS] == pytest.approx(L * layer + head)
    # On: each block's bf16 input, plus one block recomputed with its gradients, or the head's backward.
    on = estimate(_config("bf16", **compile_key), qwen15, gpus=1)
    assert on.phases["update_actor"][ACTIVATIONS] == pytest.approx(
        L * T_UPDATE * H * 2 + max(2 * layer, head)
    )


def test_recomputing_the_first_blocks_keeps_the_others_activations(qwen15: Architecture) -> None:
    layer = T_UPDATE * qwen15.activation_bytes() * COMPILED_ACTIVATIONS
    config = _config("bf16")  # EasyR1's example: every block (enable_gradient_checkpointing=true)

    def activations(blocks: int) -> float:
        return estimate(config, qwen15, gpus=1, actor_checkpointed=blocks).phases["update_actor"][ACTIVATIONS]

    assert activations(L) == estimate(config, qwen15, gpus=1).phases["update_actor"][ACTIVATIONS]
    off = _config("bf16", worker__actor__model__enable_gradient_checkpointing=False)
    assert activations(0) == estimate(off, qwen15, gpus=1).phases["update_actor"][ACTIVATIONS]
    # 10 recomputed: their inputs, and the other 18 blocks' activations (more than two blocks' worth).
    assert activations(10) == pytest.approx(10 * T_UPDATE * H * 2 + 18 * layer)
    # 27 recomputed: the one kept block's activations, or a recomputed block with its gradients (larger).
    assert activations(27) == pytest.approx(27 * T_UPDATE * H * 2 + 2 * layer)
    assert activations(0) > activations(10) > activations(26)


# The anchor's shape: 64 sequences of 768 tokens in one update micro-batch, vLLM with 12% of the GPU.
ANCHOR = dict(
    data__max_prompt_length=256,
    data__max_response_length=512,
    worker__actor__dynamic_batching=False,
    worker__actor__micro_batch_size_per_device_for_update=64,
    worker__rollout__gpu_memory_utilization=0.12,
)


def test_auto_gradient_checkpointing_recomputes_the_fewest_blocks_that_fit(qwen15: Architecture) -> None:
    # The anchor's shape (64 sequences of 768 tokens in one micro-batch), vLLM awake with 12%: about 3 GiB
    # per block kept, 67 GiB of the 118.8 (85% of 139.8) free with every block recomputed.
    auto = _config(
        "bf16", backend="vllm", **ANCHOR, worker__actor__model__enable_gradient_checkpointing="auto"
    )
    plan, why = recompute_plan(auto, qwen15, gpus=1, gpu_memory_gib=139.8)
    blocks = plan.full
    assert (
        plan == RecomputePlan(blocks)
        and 0 < blocks < L
        and why.startswith(f"gradient checkpointing auto: {blocks} of {L} decoder blocks recomputed")
    )

    def device(config: PPOConfig, k: int) -> float:
        return estimate(config, qwen15, gpus=1, gpu_memory_gib=139.8, actor_checkpointed=k).device / GIB

    kept = _config(
        "bf16", backend="vllm", **ANCHOR, worker__rollout__free_cache_engine=False
    )  # as "auto" decided it, vLLM's share kept
    assert device(kept, blocks) <= 0.85 * 139.8 < device(kept, blocks - 1)
    result = estimate(auto, qwen15, gpus=1, gpu_memory_gib=139.8)
    assert (
        result.to_dict()["phases"]
        == estimate(kept, qwen15, gpus=1, gpu_memory_gib=139.8, actor_checkpointed=blocks).to_dict()["phases"]
    )
    assert why in result.notes and any("awake" in n and "every block recomputed" in n for n in result.notes)
    # A GPU that holds every activation: none recomputed; one that holds none: all; no size given: all.
    assert recompute_plan(auto, qwen15, gpus=1, gpu_memory_gib=1000)[0] == RecomputePlan(0)
    assert recompute_plan(auto, qwen15, gpus=1, gpu_memory_gib=24)[0] == RecomputePlan(L)
    assert recompute_plan(auto, qwen15, gpus=1, gpu_memory_gib=None) == (
        RecomputePlan(L),
        "gradient checkpointing auto: every block (no GPU size to plan on)",
    )
    # true and false are EasyR1's: every block, none, whatever the GPU.
    assert recompute_plan(_config("bf16"), qwen15, gpus=1, gpu_memory_gib=1000) == (RecomputePlan(L), "")
    off = _config("bf16", worker__actor__model__enable_gradient_checkpointing=False)
    assert recompute_plan(off, qwen15, gpus=1, gpu_memory_gib=10) == (RecomputePlan(0), "")


def test_one_micro_batch_a_step_starts_backward_without_gradients(qwen15: Architecture) -> None:
    """The optimizer step sets the gradients to None, so a step of one micro-batch has none when its
    backward starts: they come as each block's backward runs, and the peak counts those of the blocks
    backward has done (the kept ones, at the first recomputed block's). With several micro-batches
    a step, the first one's gradients are there for every later one."""
    one = dict(
        data__max_prompt_length=256,
        data__max_response_length=512,
        data__rollout_batch_size=8,
        worker__actor__global_batch_size=8,
        worker__rollout__n=8,
        worker__actor__micro_batch_size_per_device_for_update=64,
    )
    config = _config("bf16", **one)
    grads = estimate(config, qwen15, gpus=1).phases["update_actor"]
    assert grads["actor gradients"] == 0.0
    tokens = 64 * 768
    layer = tokens * qwen15.activation_bytes() * COMPILED_ACTIVATIONS
    block_input = tokens * H * 2
    every_grad = P * 2  # bf16 parameters, bf16 gradients

    def activations(plan: RecomputePlan) -> float:
        return estimate(config, qwen15, gpus=1, actor_checkpointed=plan).phases["update_actor"][ACTIVATIONS]

    assert activations(RecomputePlan(L)) == pytest.approx(L * block_input + 2 * layer)  # none done yet
    assert activations(RecomputePlan(20)) == pytest.approx(
        max(20 * block_input + 8 * layer, 20 * block_input + 2 * layer + every_grad * 8 / L)
    )
    several = _config("bf16", **{**one, "worker__actor__micro_batch_size_per_device_for_update": 16})
    assert estimate(several, qwen15, gpus=1).phases["update_actor"]["actor gradients"] == every_grad


def test_partially_recomputed_blocks_keep_what_their_mode_saves(qwen15: Architecture) -> None:
    layer = T_UPDATE * qwen15.activation_bytes() * COMPILED_ACTIVATIONS
    block_input = T_UPDATE * H * 2
    pointwise, attention = (T_UPDATE * qwen15.partial_recompute_bytes(m) for m in ("pointwise", "attention"))
    assert pointwise < layer and attention < pointwise
    config = _config("bf16")

    def activations(plan: RecomputePlan) -> float:
        return estimate(config, qwen15, gpus=1, actor_checkpointed=plan).phases["update_actor"][ACTIVATIONS]

    # Every block pointwise: what they all saved, then the last one's regenerated activations and gradients.
    assert activations(RecomputePlan(0, pointwise=L)) == pytest.approx(
        L * (block_input + pointwise) + 2 * layer - pointwise
    )
    # 4 whole, 20 attention, 4 kept: the kept blocks' activations at backward's start are the peak...
    mixed = RecomputePlan(4, attention=20)
    saved = 4 * block_input + 20 * (block_input + attention)
    assert activations(mixed) == pytest.approx(saved + 4 * layer)
    # ... and with none kept, the last attention block's regenerated activations and gradients are.
    assert activations(RecomputePlan(4, attention=24)) == pytest.approx(
        4 * block_input + 24 * (block_input + attention) + 2 * layer - attention
    )
    assert mixed.modes(L) == ["full"] * 4 + ["attention"] * 20 + ["keep"] * 4


def test_auto_with_partial_recompute_redoes_fewer_flops_where_memory_is_short(qwen15: Architecture) -> None:
    """The anchor on an 80 GiB GPU: whole blocks only, auto recomputes most of them; with
    ``partial_recompute`` the first plan that fits redoes fewer forward FLOPs, and the one before it
    does not fit. Without compiled blocks or with LoRA the plan stays whole blocks."""
    anchor = dict(
        ANCHOR,
        worker__rollout__free_cache_engine=False,
        worker__actor__model__enable_gradient_checkpointing="auto",
    )
    whole, _ = recompute_plan(_config("bf16", backend="vllm", **anchor), qwen15, gpus=1, gpu_memory_gib=79.2)
    assert whole.attention == whole.pointwise == 0 and 0 < whole.full < L
    on = _config("bf16", backend="vllm", **anchor, worker__actor__model__partial_recompute=True)
    plan, why = recompute_plan(on, qwen15, gpus=1, gpu_memory_gib=79.2)
    assert plan.attention + plan.pointwise > 0 and plan.full < whole.full
    assert why.startswith(f"gradient checkpointing auto: {plan.describe(L)}, ")

    def flops(p: RecomputePlan) -> float:
        per_mode = {"full": p.full, "attention": p.attention, "pointwise": p.pointwise}
        return sum(n * qwen15.recompute_flops(mode, 768) for mode, n in per_mode.items())

    assert flops(plan) < 0.75 * flops(whole)

    def device(p: RecomputePlan) -> float:
        return estimate(on, qwen15, gpus=1, gpu_memory_gib=79.2, actor_checkpointed=p).device / GIB

    room = 0.85 * 79.2
    assert device(plan) <= room
    earlier = (
        RecomputePlan(plan.full - 1, attention=plan.attention + 1, pointwise=plan.pointwise)
        if plan.full
        else RecomputePlan(0, attention=plan.attention - 1, pointwise=plan.pointwise + 1)
    )
    assert device(earlier) > room
    for off in ({"worker__actor__use_torch_compile": False}, {"worker__actor__model__lora__rank": 64}):
        config = _config(
            "bf16", backend="vllm", **anchor, worker__actor__model__partial_recompute=True, **off
        )
        found, _ = recompute_plan(config, qwen15, gpus=1, gpu_memory_gib=79.2)
        assert found.attention == found.pointwise == 0


def test_the_optimizer_step_adds_no_term(qwen15: Architecture) -> None:
    # torch's AdamW is fused on GPUs (no temporary; the foreach one's sqrt(exp_avg_sq) of every
    # tensor, 4P, peaked the 3B and 7B AMP updates) and AdamWBF16 goes one tensor at a time, so the
    # update's peak is the backward pass's, however short the sequences.
    for precision in ("amp", "bf16"):
        short = estimate(
            _config(precision, data__max_prompt_length=16, data__max_response_length=16), qwen15, gpus=2
        )
        update = short.phases["update_actor"]
        assert ACTIVATIONS in update and not any("optimizer step" in term for term in update)


# ------------------------------------------------------------------ measured on a tiny model (CPU)


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.fixture(scope="module")
def tiny(tiny_model: Callable[[str], Path]) -> tuple[Path, Architecture]:
    path = tiny_model("qwen2")
    return path, Architecture.load(str(path))


def _load(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")


def _backward(model: torch.nn.Module, vocab: int) -> None:
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()


def test_measured_parameters_and_gradients(tiny: tuple[Path, Architecture]) -> None:
    path, arch = tiny
    assert arch.tied and arch.vision_params == 0
    model = _load(path, torch.bfloat16)
    params = list(model.parameters())  # a tied matrix once
    assert _bytes(params) == 2 * arch.params
    _backward(model, arch.vocab)
    assert all(p.grad is not None for p in params)
    assert _bytes(p.grad for p in params) == 2 * arch.params  # BF16: 2P of gradients


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        _bytes([v])
        for state in optimizer.state.values()
        for k, v in state.items()
        if k != "step" and torch.is_tensor(v)
    )


def test_measured_optimizer_state(tiny: tuple[Path, Architecture]) -> None:
    from easyr1.workers.optim import AdamWBF16

    path, arch = tiny
    # AMP: fp32 parameters, fp32 gradients, torch's AdamW (exp_avg, exp_avg_sq) = 8P.
    fp32 = _load(path, torch.float32)
    _backward(fp32, arch.vocab)
    assert _bytes(p.grad for p in fp32.parameters()) == 4 * arch.params
    adamw = torch.optim.AdamW(fp32.parameters(), lr=1e-3)
    adamw.step()
    assert len(adamw.state) == len(list(fp32.parameters()))
    assert _state_bytes(adamw) == 8 * arch.params

    # BF16: the engine's AdamWBF16 (exp_avg, exp_avg_sq and the Kahan compensation, all bf16) = 6P.
    bf16 = _load(path, torch.bfloat16)
    _backward(bf16, arch.vocab)
    ours = AdamWBF16(bf16.parameters(), lr=1e-3)
    ours.step()
    assert {k for state in ours.state.values() for k in state} == {
        "step",
        "exp_avg",
        "exp_avg_sq",
        "compensation",
    }
    assert _state_bytes(ours) == 6 * arch.params


@pytest.mark.parametrize(("kind", "temporaries"), [("foreach", 4), ("fused", 0)])
def test_measured_adamw_step_temporaries(
    tiny: tuple[Path, Architecture], kind: str, temporaries: int
) -> None:
    """The step's new tensors, recorded as the kernels create them: foreach AdamW (torch's default on
    GPUs) makes one list as large as the fp32 gradients; the fused one, the engine's on GPUs (the same
    op on CPU), makes none, which is why the estimator has no optimizer-step term."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class NewTensors(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if not func._schema.is_mutable:  # in-place updates of the moments and weights allocate nothing
                flat = out if isinstance(out, (list, tuple)) else [out]
                self.bytes += _bytes(t for t in flat if torch.is_tensor(t) and t.dim() > 0)
            return out

    path, arch = tiny
    model = _load(path, torch.float32)
    _backward(model, arch.vocab)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, **{kind: True})
    adamw.step()  # the first step creates the moments themselves
    _backward(model, arch.vocab)
    with NewTensors() as new:
        adamw.step()
    assert new.bytes == temporaries * arch.params


@pytest.mark.parametrize(
    ("targets", "exclude"),
    [
        ("all-linear", None),
        ("q_proj,v_proj", None),
        ("all-linear", r"model\.layers\.0\..*"),
        ("all-linear", r".*mlp.*"),
        ("self_attn.q_proj", None),
    ],
)
def test_lora_adapter_count_against_peft(
    tiny: tuple[Path, Architecture], targets: str, exclude: str | None
) -> None:
    pytest.importorskip("peft")
    from easyr1.models.lora import apply_lora
    from easyr1.workers.config import LoraConfig

    path, arch = tiny
    model = apply_lora(
        _load(path, torch.float32),
        LoraConfig(rank=8, alpha=8, target_modules=targets, exclude_modules=exclude),
    )
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert adapters > 0
    assert arch.lora_params(8, targets, exclude) == adapters


def _eager_expected(h: int, i: int, heads: int, kv_heads: int, head_dim: int, tokens: int) -> Counter:
    """What eager PyTorch saves, derived by hand from Qwen2's decoder layer: (dtype, elements) per storage."""
    q, kv, bf16, f32 = heads * head_dim, kv_heads * head_dim, torch.bfloat16, torch.float32
    saved = Counter()
    # Each RMSNorm: its input in float32 (kept by pow and by the product with rsqrt), rsqrt (float32,
    # one per token), the bf16 normalised value (kept by the product with the weight) and the output
    # (kept by the next linear layers as their input; q, k and v share it, as do gate and up).
    for _ in range(2):
        saved[(f32, tokens * h)] += 1
        saved[(f32, tokens)] += 1
        saved[(bf16, tokens * h)] += 2
    # Attention. q*cos and rotate_half(q)*sin need only cos and sin for q's gradient, so the projections'
    # q and k are not kept; sdpa keeps q and k after rotary, v, its output (the o projection's input,
    # the same storage) and the log-sum-exp (float32, one per head and token).
    saved[(bf16, tokens * q)] += 2
    saved[(bf16, tokens * kv)] += 2
    saved[(f32, tokens * heads)] += 1
    saved[(bf16, tokens * i)] += 4  # gate (kept by SiLU), SiLU's output, up, their product (down's input)
    return saved


TOKENS = 64


def test_measured_activations_of_one_decoder_layer(tiny: tuple[Path, Architecture]) -> None:
    """Eager PyTorch's saved tensors, tensor by tensor, against a hand derivation; the per-token total is
    then 16h + 4q + 4kv + 8i + 4 heads + 8 where activation_bytes() documents 20h + 6q + 6kv + 8i."""
    path, arch = tiny
    model = _load(path, torch.bfloat16)
    model.train()
    assert model.config._attn_implementation == "sdpa"
    saved, other = saved_for_backward(model.model.layers[0], model.model.rotary_emb, arch.hidden, TOKENS)
    measured = Counter((t.dtype, t.untyped_storage().nbytes() // t.element_size()) for t in saved)
    assert measured == _eager_expected(
        arch.hidden, arch.intermediate, arch.heads, arch.kv_heads, arch.head_dim, TOKENS
    )
    h, q, kv, i = arch.hidden, arch.q, arch.kv, arch.intermediate
    assert sum(t.untyped_storage().nbytes() for t in saved) == TOKENS * (
        16 * h + 4 * q + 4 * kv + 8 * i + 4 * arch.heads + 8
    )
    assert other == {"cos": 2 * TOKENS * arch.head_dim, "sin": 2 * TOKENS * arch.head_dim}


def _qwen15_layer() -> tuple[torch.nn.Module, torch.nn.Module, Architecture]:
    """One decoder layer of Qwen2.5-1.5B's shapes (random weights), to see the formula at full size."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    config = qwen2_layer_config(H, FFN, HEADS, KV_HEADS, vocab=V)
    layer = Qwen2DecoderLayer(config, 0).to(torch.bfloat16)
    arch = Architecture(
        hidden=H,
        intermediate=FFN,
        layers=L,
        heads=HEADS,
        kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        vocab=V,
        tied=True,
        params=P,
        vision_params=0,
    )
    return layer, Qwen2RotaryEmbedding(config), arch


def _layer(
    shape: str, tiny: tuple[Path, Architecture]
) -> tuple[torch.nn.Module, torch.nn.Module, Architecture]:
    """The tiny model's first decoder layer, or one of Qwen2.5-1.5B's shapes."""
    if shape != "tiny":
        return _qwen15_layer()
    path, arch = tiny
    model = _load(path, torch.bfloat16)
    return model.model.layers[0], model.model.rotary_emb, arch


# The formula counts what an eager block keeps, all but each norm's per-token rsqrt (4 bytes each).
TOLERANCE = 0.01


@pytest.mark.parametrize(
    "shape",
    [
        "tiny",
        "qwen2.5-1.5b layer",
    ],
)
def test_activation_bytes_against_measurement(shape: str, tiny: tuple[Path, Architecture]) -> None:
    layer, rotary, arch = _layer(shape, tiny)
    layer.train()
    saved, _ = saved_for_backward(layer, rotary, arch.hidden, TOKENS)
    measured = sum(t.untyped_storage().nbytes() for t in saved) / TOKENS
    assert arch.activation_bytes() == pytest.approx(measured, rel=TOLERANCE), (
        arch.activation_bytes(),
        measured,
    )


class _LiveTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """The bytes of the tensors ops create and something still holds, and their highest total:
    what a forward pass without autograd holds at once besides its inputs and weights."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.holders: dict[int, list[int]] = {}  # storage -> [tensors holding it, bytes]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        import weakref

        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() == 0:
                continue
            key = t.untyped_storage().data_ptr()
            if key not in self.holders:
                inputs = torch.utils._pytree.tree_flatten((args, kwargs))[0]
                if any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == key for a in inputs):
                    continue  # a view of the layer's input or weights, or an op that wrote into one
                self.holders[key] = [0, t.untyped_storage().nbytes()]
                self.live += self.holders[key][1]
                self.peak = max(self.peak, self.live)
            self.holders[key][0] += 1  # a view of a tracked tensor keeps its storage too
            weakref.finalize(t, self._release, key)
        return out

    def _release(self, key: int) -> None:
        holder = self.holders[key]
        holder[0] -= 1
        if holder[0] == 0:
            self.live -= holder[1]
            del self.holders[key]


@pytest.mark.parametrize("shape", ["tiny", "qwen2.5-1.5b layer"])
def test_forward_bytes_against_measurement(shape: str, tiny: tuple[Path, Architecture]) -> None:
    """A decoder layer's forward pass without autograd, tensor by tensor: the most it holds at once
    besides its input, plus the input the caller keeps (2h), is ``forward_bytes`` per token."""
    layer, rotary, arch = _layer(shape, tiny)
    x = torch.randn(1, TOKENS, arch.hidden, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(TOKENS)[None]
    with torch.no_grad():
        embeddings = rotary(x, positions)
        with _LiveTensors() as live:
            layer(x, attention_mask=None, position_ids=positions, position_embeddings=embeddings)
    assert live.peak / TOKENS + 2 * arch.hidden == arch.forward_bytes()


# ------------------------------------------------------------------ the command line


def test_cli_prints_the_estimate_as_json(capsys: pytest.CaptureFixture[str], qwen15: Architecture) -> None:
    from easyr1.cli import main

    values = {
        **workload_config("easyr1_1.5b", "hf", 1, "bf16"),
        "data.train_files": "x",
        "worker.actor.model.model_path": "x",
    }
    overrides = [f"{k}={override_value(v)}" for k, v in values.items()]
    assert (
        main(["memory", "--model", "qwen2:1.5b", "--gpus", "1", "--gpu-memory", "24", "--json", *overrides])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    expected = estimate(load_config(overrides), qwen15, gpus=1, gpu_memory_gib=24)
    assert out["params"] == P and out["gpus"] == 1 and out["gpu_memory_gib"] == 24
    assert set(out["phases"]) == {"rollout", "experience", "update_actor"}
    assert out["phases"]["update_actor"]["actor optimizer state"] == pytest.approx(6 * P / GIB)
    for phase, terms in expected.phases.items():
        assert out["phases"][phase] == pytest.approx({k: v / GIB for k, v in terms.items()}), phase
    # 23.1 GiB on one 24 GiB GPU: it fits, and one is the smallest count.
    assert out["device_gib"] == pytest.approx(expected.device / GIB) and out["device_gib"] <= 24
    assert out["fits"] is True and out["smallest_fit"] == 1
    assert (
        main(["memory", "--model", "qwen2:1.5b", "--gpus", "1", "--gpu-memory", "16", "--json", *overrides])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and out["smallest_fit"] == 2  # 15.9 GiB on 2


def test_cli_says_why_a_vllm_run_needs_the_gpu_size(capsys: pytest.CaptureFixture[str]) -> None:
    """The vLLM rollout's share is a fraction of the GPU: without its size, a usage error, no traceback."""
    from easyr1.cli import main

    overrides = ["data.train_files=x", "worker.actor.model.model_path=x", "worker.rollout.name=vllm"]
    with pytest.raises(SystemExit) as exit_:
        main(["memory", "--model", "qwen2:1.5b", "--gpus", "1", *overrides])
    assert exit_.value.code == 2
    assert "gpu_memory_utilization): give --gpu-memory" in capsys.readouterr().err


def test_more_than_one_rank_adds_nccls_buffers_to_the_context(qwen15: Architecture) -> None:
    # Outside the allocator: the CUDA context (0.83 GiB measured on one H200) and, with a second rank,
    # NCCL's communicator buffers (1.60-1.61 GiB in all on the two-GPU records).
    one = estimate(_config("bf16"), qwen15, gpus=1, gpu_memory_gib=80)
    two = estimate(_config("bf16", gpus=2), qwen15, gpus=2, gpu_memory_gib=80)
    assert one.context == pytest.approx(0.85 * GIB) and two.context == pytest.approx(1.62 * GIB)
    assert two.device == pytest.approx(two.allocated + two.context)


@pytest.mark.parametrize("adapters", ["fp32", "bf16"])
def test_a_lora_block_keeps_by_its_adapters_dtype(adapters: str) -> None:
    """peft keeps LoRA adapters in fp32 on a bf16 model and casts each adapted layer's input for them
    (``torch_dtype=bf16``); under AMP FSDP computes them in bf16 (here: the whole model cast to bf16).
    Measured on one block of Qwen2.5-1.5B's shapes, eager and compiled, against the shares the estimate
    plans with. Compiled shares are the H200's: inductor's CPU partition keeps a little less than its
    CUDA one (0.68 of ``activation_bytes`` for a plain block, against 0.73)."""
    from transformers import Qwen2ForCausalLM

    from easyr1.activations import LORA_FP32_ACTIVATIONS, LORA_FP32_COMPILED_ACTIVATIONS
    from easyr1.models.lora import apply_lora
    from easyr1.workers.config import LoraConfig
    from easyr1.workers.fsdp import DTYPES

    config = qwen2_layer_config(H, FFN, HEADS, KV_HEADS)
    torch.manual_seed(0)
    model = apply_lora(Qwen2ForCausalLM(config).to(torch.bfloat16), LoraConfig(rank=64, alpha=64))
    if adapters == "bf16":
        model = model.to(torch.bfloat16)
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {DTYPES[adapters]}
    inner = model.get_base_model().model
    layer, rotary = inner.layers[0], inner.rotary_emb
    layer.train()
    arch = _qwen15_layer()[2]
    shares = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        if compiled:
            layer.forward = torch.compile(type(layer).forward.__get__(layer))
        saved, _ = saved_for_backward(layer, rotary, H, TOKENS)
        shares[compiled] = sum(t.untyped_storage().nbytes() for t in saved) / TOKENS / arch.activation_bytes()
    if adapters == "fp32":
        assert shares[False] == pytest.approx(LORA_FP32_ACTIVATIONS, rel=0.01)
        assert shares[True] == pytest.approx(LORA_FP32_COMPILED_ACTIVATIONS, rel=0.03)
    else:  # what a plain block keeps
        assert shares[False] == pytest.approx(1.0, rel=0.06)
        assert shares[True] == pytest.approx(COMPILED_ACTIVATIONS, rel=0.08)
