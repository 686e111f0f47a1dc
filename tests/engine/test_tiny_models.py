"""Tiny offline models: real architectures that save, reload by path, render chats and generate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from easyr1.models.loading import (
    Qwen2VLImageOnlyProcessor,
    is_vision_model,
    load_model,
    load_processor,
    load_tokenizer,
)
from easyr1.models.tiny import ARCHS, VISION_ARCHS, build_tiny_model

TEXT_ARCHS = tuple(a for a in ARCHS if a not in VISION_ARCHS)
CLASSES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
QUESTION = "How many shapes are in the image? Put the answer in \\boxed{}."


def _images(n: int) -> list[Image.Image]:
    return [Image.new("RGB", (56, 56), (200, 30, 30)), Image.new("RGB", (84, 56), (30, 200, 30))][:n]


def _user(n_images: int) -> list[dict]:
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": QUESTION}]
    return [{"role": "user", "content": content}]


def _vision_ids(tokenizer) -> list[int]:
    return tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))


def test_weights_are_readable_as_any_new_file(tmp_path: Path) -> None:
    """safetensors writes its files 0600; a model folder on a shared cluster is read by others."""
    umask = os.umask(0o027)
    try:
        out = build_tiny_model("qwen2", tmp_path / "model")
    finally:
        os.umask(umask)
    assert (
        (out / "model.safetensors").stat().st_mode & 0o777
        == (out / "config.json").stat().st_mode & 0o777
        == 0o640
    )


def test_unknown_arch_lists_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="qwen2_5_vl"):
        build_tiny_model("gpt2", tmp_path)


@pytest.mark.parametrize("arch", ARCHS)
def test_folder_config_and_token_ids(arch: str, tiny_model) -> None:
    path = tiny_model(arch)
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    assert ("preprocessor_config.json" in names) == (arch in VISION_ARCHS) == is_vision_model(path)
    config = json.loads((path / "config.json").read_text())
    generation = json.loads((path / "generation_config.json").read_text())
    assert config["architectures"] == [CLASSES[arch]]
    assert config["tie_word_embeddings"] == (arch != "llama")

    tokenizer = load_tokenizer(path)
    text = config.get("text_config", config)
    assert text["vocab_size"] == len(tokenizer)
    assert tokenizer.pad_token_id == generation["pad_token_id"]
    if arch == "llama":
        assert tokenizer.bos_token == "<|begin_of_text|>" and tokenizer.eos_token == "<|eot_id|>"
        stops = ["<|eot_id|>", "<|end_of_text|>"]
        assert generation["eos_token_id"] == tokenizer.convert_tokens_to_ids(stops)
        assert generation["bos_token_id"] == tokenizer.bos_token_id
    else:
        assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
        assert generation["eos_token_id"] == tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    if arch in VISION_ARCHS:
        for key, token in [
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        ]:
            assert config[key] == tokenizer.convert_tokens_to_ids(token), key


@pytest.mark.parametrize("arch", ARCHS)
def test_same_seed_same_bytes(arch: str, tiny_model, tmp_path: Path) -> None:
    reference = tiny_model(arch)
    again = build_tiny_model(arch, tmp_path / "again", seed=0)
    other = build_tiny_model(arch, tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (reference / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (reference / "model.safetensors").read_bytes()


@pytest.mark.parametrize("arch", ARCHS)
def test_reload_is_small_and_tied_as_the_family(arch: str, tiny_model) -> None:
    model = load_model(tiny_model(arch))
    assert type(model).__name__ == CLASSES[arch]
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == (arch != "llama")


def test_qwen_chat_template(tiny_model) -> None:
    tokenizer = load_tokenizer(tiny_model("qwen2_5_vl"))
    messages = [{"role": "system", "content": "You are a helpful assistant."}] + _user(2)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{image}{image}{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|image_pad|>")) == 2
    assert tokenizer.decode(ids) == text
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False)
    assert plain == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"


def test_llama3_chat_template(tiny_model) -> None:
    tokenizer = load_tokenizer(tiny_model("llama"))
    text = tokenizer.apply_chat_template(_user(0), add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
        f"{QUESTION}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tokenizer.apply_chat_template(_user(0), add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 1  # the template's bos, not a second one from encoding
    assert tokenizer("x")["input_ids"][0] == tokenizer.bos_token_id  # plain encoding prepends bos, as Llama-3


def test_common_prompt_words_are_single_tokens(tiny_model) -> None:
    tokenizer = load_tokenizer(tiny_model("qwen2"))
    for word in (" shapes", " image", " answer", "boxed", "user", "assistant", "<think>", "</think>"):
        assert len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1, word
    assert 900 <= len(tokenizer) <= 2048


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_from_chat_without_images(arch: str, tiny_model) -> None:
    path = tiny_model(arch)
    tokenizer, model, processor = load_tokenizer(path), load_model(path), load_processor(path)
    assert (processor is None) == (arch not in VISION_ARCHS)
    tokenizer.padding_side = "left"
    chats = [[{"role": "user", "content": "What is 2 + 3?"}], _user(0)]
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    encode = processor if processor is not None else tokenizer
    if processor is not None:
        processor.tokenizer.padding_side = "left"
    inputs = encode(text=texts, return_tensors="pt", padding=True, add_special_tokens=False)
    suppress = _vision_ids(tokenizer) if arch in VISION_ARCHS else None
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False, suppress_tokens=suppress)
    new = out[:, inputs["input_ids"].shape[1] :]
    assert new.shape == (2, 4)
    assert int(new.max()) < len(tokenizer)


@pytest.mark.parametrize("n_images", [1, 2])
@pytest.mark.parametrize("arch", VISION_ARCHS)
def test_generate_with_images(arch: str, n_images: int, tiny_model) -> None:
    path = tiny_model(arch)
    processor, model = load_processor(path), load_model(path)
    tokenizer = processor.tokenizer
    text = processor.apply_chat_template(_user(n_images), add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=_images(n_images), return_tensors="pt")
    # 56x56 -> 2x2 merged patches, 84x56 -> 3x2 (28-pixel tokens for Qwen2/2.5-VL, 32-pixel for Qwen3-VL)
    expected = [4, 6][:n_images]
    assert (inputs["image_grid_thw"].prod(-1) // 4).tolist() == expected
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((inputs["input_ids"] == image_id).sum()) == sum(expected)

    bad = [[i] for i in _vision_ids(tokenizer)]
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False, bad_words_ids=bad)
    new = out[0, inputs["input_ids"].shape[1] :]
    assert len(new) == 4 and not set(new.tolist()) & set(_vision_ids(tokenizer))

    # Re-scoring the whole sequence with the same images works (the image token count still matches);
    # M-RoPE needs the image-token map of the full sequence (transformers 5).
    image_map = (out == image_id).long()
    pixels = {k: inputs[k] for k in ("pixel_values", "image_grid_thw")}
    with torch.no_grad():
        mask = torch.ones_like(out)
        logits = model(input_ids=out, attention_mask=mask, mm_token_type_ids=image_map, **pixels).logits
    assert logits.shape[:2] == out.shape and torch.isfinite(logits).all()


def test_llama_has_no_pad_and_loader_adds_eos(tiny_model) -> None:
    path = tiny_model("llama")
    saved = json.loads((path / "tokenizer_config.json").read_text())
    assert saved.get("pad_token") is None  # like the real Llama-3 tokenizer
    assert load_tokenizer(path).pad_token == "<|eot_id|>"


def test_image_only_processor_refuses_videos(tiny_model) -> None:
    processor = Qwen2VLImageOnlyProcessor.from_pretrained(str(tiny_model("qwen2_vl")))
    with pytest.raises(ValueError, match="images only"):
        processor(text=["<|vision_start|><|video_pad|><|vision_end|>"], videos=[[_images(1)[0]] * 2])


def test_processor_saved_here_reloads(tiny_model, tmp_path: Path) -> None:
    source = tiny_model("qwen3_vl")
    target = tmp_path / "merged"
    load_model(source).save_pretrained(target)
    load_processor(source).save_pretrained(target)
    saved = json.loads((target / "processor_config.json").read_text())
    assert saved["processor_class"] == "Qwen3VLProcessor"
    processor = load_processor(target)
    assert processor.image_processor.patch_size == 16
    assert processor.chat_template == load_tokenizer(source).chat_template


def test_missing_folder_or_config_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_model(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    for load in (load_model, load_tokenizer, load_processor, is_vision_model):
        with pytest.raises(FileNotFoundError, match=r"config\.json.*empty"):
            load(empty)
