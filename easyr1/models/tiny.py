"""Tiny random models of real architectures, built offline, for tests and CPU runs.

Each one is a real transformers class at toy size, saved as a normal model folder (weights, configs,
tokenizer, image processor) so the engine loads it by path exactly as it loads a downloaded model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
)

from easyr1.files import share_weight_files
from easyr1.models.tokenizer import build_tokenizer

ARCHS = ("qwen2", "qwen3", "llama", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")
VISION_ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

HIDDEN = 64
_TEXT = dict(
    hidden_size=HIDDEN,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
)
# M-RoPE sections sum to head_dim / 2; Qwen3-VL interleaves them.
_MROPE_QWEN2 = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
_MROPE_QWEN3 = {
    "rope_type": "default",
    "rope_theta": 5e6,
    "mrope_section": [4, 2, 2],
    "mrope_interleaved": True,
}
# Vision towers: 2 blocks of width 32, 2 heads; the merger projects to the text width.
_VISION = {
    "qwen2_vl": dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=HIDDEN, patch_size=14),
    "qwen2_5_vl": dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=HIDDEN,
        fullatt_block_indexes=[1],
        window_size=112,
        patch_size=14,
    ),
    "qwen3_vl": dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=HIDDEN,
        num_position_embeddings=256,
        deepstack_visual_indexes=[1],
        patch_size=16,
    ),
}
# Image tokens per image are kept between 4 and 64 (one token covers a (2*patch)^2 square).
_MIN_TOKENS, _MAX_TOKENS = 4, 64
_MAX_TOKENS_FULL_SIZE = 16384  # Qwen2.5-VL's max_pixels of 12845056 in 28x28 tokens

# Real families' sizes, random-initialised, for GPU benchmarks (architecture only: the
# tokenizer stays the small local one, the embedding keeps the family's vocabulary size).
SIZES: dict[tuple[str, str], dict[str, Any]] = {
    ("qwen2", "1.5b"): {  # Qwen2.5-1.5B
        "text": dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            vocab_size=151936,
            max_position_embeddings=32768,
        ),
    },
    ("qwen2", "3b"): {  # Qwen2.5-3B
        "text": dict(
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=2,
            vocab_size=151936,
            max_position_embeddings=32768,
        ),
    },
    # From 7B on, Qwen2.5's input and output embeddings are separate matrices.
    ("qwen2", "7b"): {  # Qwen2.5-7B
        "text": dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
            max_position_embeddings=32768,
        ),
        "tied": False,
    },
    ("qwen2", "32b"): {  # Qwen2.5-32B
        "text": dict(
            hidden_size=5120,
            intermediate_size=27648,
            num_hidden_layers=64,
            num_attention_heads=40,
            num_key_value_heads=8,
            vocab_size=152064,
            max_position_embeddings=32768,
        ),
        "tied": False,
    },
    ("qwen2", "72b"): {  # Qwen2.5-72B
        "text": dict(
            hidden_size=8192,
            intermediate_size=29568,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            vocab_size=152064,
            max_position_embeddings=32768,
        ),
        "tied": False,
    },
    ("qwen2_5_vl", "3b"): {  # Qwen2.5-VL-3B
        "text": dict(
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=2,
            vocab_size=151936,
            max_position_embeddings=128000,
        ),
        "mrope_section": [16, 24, 24],
        "vision": dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=2048,
            fullatt_block_indexes=[7, 15, 23, 31],
            window_size=112,
            patch_size=14,
        ),
    },
    ("qwen3", "4b"): {  # Qwen3-4B
        "text": dict(
            hidden_size=2560,
            intermediate_size=9728,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            max_position_embeddings=40960,
        ),
    },
    ("qwen2_5_vl", "7b"): {  # Qwen2.5-VL-7B
        "text": dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
            max_position_embeddings=128000,
        ),
        "tied": False,
        "mrope_section": [16, 24, 24],
        "vision": dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=3584,
            fullatt_block_indexes=[7, 15, 23, 31],
            window_size=112,
            patch_size=14,
        ),
    },
    ("qwen2_5_vl", "32b"): {  # Qwen2.5-VL-32B
        "text": dict(
            hidden_size=5120,
            intermediate_size=27648,
            num_hidden_layers=64,
            num_attention_heads=40,
            num_key_value_heads=8,
            vocab_size=152064,
            max_position_embeddings=128000,
        ),
        "tied": False,
        "mrope_section": [16, 24, 24],
        "vision": dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3456,
            num_heads=16,
            out_hidden_size=5120,
            fullatt_block_indexes=[7, 15, 23, 31],
            window_size=112,
            patch_size=14,
        ),
    },
    ("qwen3_vl", "4b"): {  # Qwen3-VL-4B
        "text": dict(
            hidden_size=2560,
            intermediate_size=9728,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            max_position_embeddings=262144,
        ),
        "mrope_section": [24, 20, 20],
        "vision": dict(
            depth=24,
            hidden_size=1024,
            intermediate_size=4096,
            num_heads=16,
            out_hidden_size=2560,
            num_position_embeddings=2304,
            deepstack_visual_indexes=[5, 11, 17],
            patch_size=16,
        ),
    },
}


def _ids(tokenizer: PreTrainedTokenizerFast, *tokens: str) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(t) for t in tokens]


def model_config(arch: str, tokenizer: PreTrainedTokenizerFast, size: str = "tiny") -> dict[str, Any]:
    """Model config as a dict; token ids and tying follow the real families' config.json files."""
    config: dict[str, Any] = dict(_TEXT, vocab_size=len(tokenizer), dtype="float32")
    scaled = SIZES.get((arch, size), {})
    config.update(scaled.get("text", {}))
    if arch == "llama":
        bos, end_of_text, eot = _ids(tokenizer, "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")
        # Untied like Llama-3.1-8B, so the untied path of the engine is exercised too.
        return dict(
            config,
            model_type="llama",
            bos_token_id=bos,
            eos_token_id=[eot, end_of_text],
            tie_word_embeddings=False,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 5e5},
        )
    end_of_text, im_end = _ids(tokenizer, "<|endoftext|>", "<|im_end|>")
    # Qwen's config.json names <|endoftext|> as bos although the tokenizer never prepends it.
    config.update(
        bos_token_id=end_of_text,
        eos_token_id=im_end,
        tie_word_embeddings=scaled.get("tied", True),
        rms_norm_eps=1e-6,
    )
    if arch == "qwen2":
        config.pop("head_dim")  # Qwen2 derives it: hidden_size / num_attention_heads
        return dict(config, model_type="qwen2", rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if arch == "qwen3":
        return dict(config, model_type="qwen3", rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    rope = _MROPE_QWEN3 if arch == "qwen3_vl" else _MROPE_QWEN2
    if "mrope_section" in scaled:
        rope = dict(rope, mrope_section=scaled["mrope_section"])
    text = dict(config, rope_parameters=rope)
    if arch != "qwen3_vl":
        text.pop("head_dim")
    vision_start, vision_end, image, video = _ids(
        tokenizer, "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
    )
    return dict(
        model_type=arch,
        text_config=text,
        vision_config=scaled.get("vision", _VISION[arch]),
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=vision_start,
        vision_end_token_id=vision_end,
        tie_word_embeddings=scaled.get("tied", True),
        dtype="float32",
    )


def _generation_config(arch: str, tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    """Stop on the chat end token and on end-of-text, as the real generation_config.json files do."""
    if arch == "llama":
        bos, end_of_text, eot = _ids(tokenizer, "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")
        # Llama-3 has no pad token; the loader pads with the eos token, so generation does too.
        return GenerationConfig(bos_token_id=bos, eos_token_id=[eot, end_of_text], pad_token_id=eot)
    end_of_text, im_end = _ids(tokenizer, "<|endoftext|>", "<|im_end|>")
    return GenerationConfig(
        bos_token_id=end_of_text, eos_token_id=[im_end, end_of_text], pad_token_id=end_of_text
    )


def _image_processor(arch: str, max_tokens: int) -> Qwen2VLImageProcessorPil:
    """The PIL image processor (no torchvision needed); Qwen3-VL uses 16-pixel patches and mean/std 0.5."""
    patch = _VISION[arch]["patch_size"]
    token_area = (2 * patch) ** 2
    extra = dict(image_mean=[0.5] * 3, image_std=[0.5] * 3) if arch == "qwen3_vl" else {}
    return Qwen2VLImageProcessorPil(
        patch_size=patch,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": _MIN_TOKENS * token_area, "longest_edge": max_tokens * token_area},
        **extra,
    )


def build_tiny_model(
    arch: str,
    out_dir: str | Path,
    seed: int = 0,
    size: str = "tiny",
    device: str = "cpu",
    weights: bool = True,
) -> Path:
    """Build a random `arch` model, save it as a model folder in `out_dir` and return that path.

    ``size="tiny"`` (the default) is the test size; the names in ``SIZES`` give a real family's
    architecture at full size (saved in bf16), for benchmarks. The same seed gives byte-identical
    weights, so runs that start from a tiny model are reproducible. ``weights=False``: the folder
    without weight files (config, generation config, tokenizer, image processor), for simulated
    ranks, which initialise their own shards at random (``distributed/simulated.py``).
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny model architecture {arch!r}; valid: {', '.join(ARCHS)}")
    if size != "tiny" and (arch, size) not in SIZES:
        valid = ", ".join(f"{a} {s}" for a, s in SIZES)
        raise ValueError(f"no size {size!r} for {arch}; sizes: tiny, or {valid}")
    out = Path(out_dir)
    tokenizer = build_tokenizer("llama3" if arch == "llama" else "qwen")
    config_dict = model_config(arch, tokenizer, size)
    config = AutoConfig.for_model(**config_dict)
    auto_model = AutoModelForImageTextToText if arch in VISION_ARCHS else AutoModelForCausalLM
    torch.manual_seed(seed)
    dtype = torch.float32 if size == "tiny" else torch.bfloat16
    with torch.device(device if weights else "meta"):
        model = auto_model.from_config(config, dtype=dtype)
    model.generation_config = _generation_config(arch, tokenizer)
    if weights:
        model.save_pretrained(out)
        share_weight_files(Path(out))
    else:
        model.config.save_pretrained(out)
        model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if arch in VISION_ARCHS:
        # Written as a downloaded Qwen-VL folder has it: preprocessor_config.json next to the tokenizer.
        _image_processor(arch, _MAX_TOKENS if size == "tiny" else _MAX_TOKENS_FULL_SIZE).save_pretrained(out)
    return out
