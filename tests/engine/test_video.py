"""Videos: EasyR1's ``videos`` column decoded with PyAV, sampled at ``data.video_fps`` under the frame
cap, processed for Qwen2-VL, Qwen2.5-VL and Qwen3-VL without torchvision, and taken by the model,
the packed (padding-free) forward, the Hugging Face rollout and the vLLM request assembly.

The frame processing is checked against the families' own definitions: a video of two identical
frames is, for these vision towers, exactly an image (the image processor repeats an image over the
temporal patch), and Qwen3-VL's transformers video processor, whose module imports without
torchvision, runs here on frames that need no resizing (the step that needs torchvision)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.video_utils import make_batched_metadata

from easyr1.config import ConfigError, PPOConfig, validate
from easyr1.data.config import DataConfig
from easyr1.data.dataset import DatasetError, RLDataset
from easyr1.data.synthetic import VIDEO_FPS, VIDEO_FRAMES, make_rows, write_task
from easyr1.data.videos import Video, encode_video, load_video, sample_indices
from easyr1.experience import Experience, scoring_batch
from easyr1.models.attention import use_packed_attention
from easyr1.models.loading import Qwen3VLImageOnlyProcessor, load_model, load_processor, load_tokenizer
from easyr1.models.video import FrameVideoProcessor
from easyr1.rollout.base import SamplingParams
from easyr1.rollout.config import RolloutConfig
from easyr1.rollout.hf import generate
from easyr1.rollout.vllm import engine_kwargs, vllm_prompt
from easyr1.workers.logprobs import install_scoring_head, token_logprobs

VISION = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _frames(count: int, size: tuple[int, int] = (56, 56), seed: int = 0) -> list[Image.Image]:
    """Random frames, ``size`` as (width, height)."""
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(count)
    ]


def _config(**overrides: Any) -> DataConfig:
    base = dict(
        prompt_key="problem", answer_key="answer", min_pixels=None, max_pixels=None, max_prompt_length=512
    )
    return DataConfig(**{**base, **overrides})


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _load(path: Path | str, arch: str, tiny_model: Callable[[str], Path], **overrides: Any) -> RLDataset:
    model = tiny_model(arch)
    return RLDataset(str(path), load_tokenizer(model), load_processor(model), _config(**overrides))


# ---- decoding and sampling ----------------------------------------------------------------------


def test_frames_are_sampled_at_video_fps_under_the_cap() -> None:
    assert sample_indices(20, fps=10, video_fps=2.0, max_frames=128) == [0, 6, 13, 19]  # 2 s at 2 fps
    assert len(sample_indices(20, fps=10, video_fps=4.0, max_frames=128)) == 8
    assert len(sample_indices(20, fps=10, video_fps=4.0, max_frames=6)) == 6  # the cap
    assert len(sample_indices(20, fps=10, video_fps=4.0, max_frames=7)) == 6  # an even count
    assert len(sample_indices(20, fps=10, video_fps=0.1, max_frames=128)) == 4  # at least 4 frames
    assert sample_indices(3, fps=10, video_fps=2.0, max_frames=128) == [0, 2]  # no more than the file has
    assert sample_indices(1, fps=10, video_fps=2.0, max_frames=128) == [0, 0]  # one frame: one temporal patch
    with pytest.raises(ValueError, match="max_frames=1"):
        sample_indices(20, fps=10, video_fps=2.0, max_frames=1)


def test_decoding_keeps_the_sampled_frames_exactly(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (56, 28), (10 * i, 255 - 10 * i, 7 * i)) for i in range(20)]
    data = encode_video(frames, fps=10)
    video = load_video({"bytes": data}, None, video_fps=2.0, max_frames=128, min_pixels=None, max_pixels=None)
    assert (video.fps, video.total_frames, video.indices) == (10.0, 20, (0, 6, 13, 19))
    assert video.frames.shape == (4, 28, 56, 3)
    for got, index in zip(
        video.frames, video.indices, strict=True
    ):  # x264 at qp 0: only RGB <-> YUV rounding
        assert np.abs(got.astype(int) - np.asarray(frames[index])).max() <= 3
    assert video.sampled_fps == pytest.approx(2.0)
    (tmp_path / "clip.mp4").write_bytes(data)
    by_path = load_video("clip.mp4", str(tmp_path), 2.0, 128, None, None)  # relative to data.image_dir
    assert (by_path.frames == video.frames).all()
    smaller = load_video(data, None, 2.0, 128, min_pixels=None, max_pixels=392)  # frames scaled like images
    assert smaller.frames.shape == (4, 14, 28, 3)


# ---- the dataset --------------------------------------------------------------------------------


def test_dataset_reads_paths_and_bytes_alike(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    write_task("moving_bar", tmp_path / "bytes", n_train=4, n_test=2, seed=0)
    write_task("moving_bar", tmp_path / "paths", n_train=4, n_test=2, seed=0, fmt="jsonl")
    by_bytes = _load(tmp_path / "bytes" / "train.parquet", "qwen2_5_vl", tiny_model)
    by_path = _load(
        tmp_path / "paths" / "train.jsonl",
        "qwen2_5_vl",
        tiny_model,
        image_dir=str(tmp_path / "paths" / "images"),
    )
    assert len(by_bytes) == len(by_path) == 4
    for a, b in zip(by_bytes, by_path, strict=True):
        assert a["input_ids"].tolist() == b["input_ids"].tolist()
        torch.testing.assert_close(
            a["multi_modal_inputs"]["pixel_values_videos"], b["multi_modal_inputs"]["pixel_values_videos"]
        )
        # 4 frames at 2 fps, 56 x 56: 2 temporal patches of 2 x 2 tokens
        assert a["multi_modal_inputs"]["video_grid_thw"].tolist() == [[2, 4, 4]]
        assert a["multi_modal_inputs"]["second_per_grid_ts"].tolist() == [1.0]  # temporal patch 2 / 2 fps
        assert a["videos"][0].indices == (0, 1, 2, 3)
        assert a["prompt"].count("<|video_pad|>") == 1
        assert int((a["input_ids"] == by_bytes.tokenizer.convert_tokens_to_ids("<|video_pad|>")).sum()) == 8


def test_dataset_respects_video_fps_and_the_frame_cap(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    video = encode_video(_frames(20), fps=10)  # 2 s
    path = _parquet(
        tmp_path / "v.parquet",
        [{"problem": "<video>Which way?", "answer": "left", "videos": [{"bytes": video}]}],
    )
    for fps, cap, frames in ((2.0, 128, 4), (4.0, 128, 8), (4.0, 6, 6), (10.0, 128, 20)):
        item = _load(path, "qwen2_vl", tiny_model, video_fps=fps, video_max_frames=cap)[0]
        assert len(item["videos"][0].indices) == frames
        assert item["multi_modal_inputs"]["video_grid_thw"].tolist() == [[frames // 2, 4, 4]]
    with pytest.raises(ConfigError, match="data.video_max_frames"):
        validate(PPOConfig(data=DataConfig(video_max_frames=1)))
    with pytest.raises(ConfigError, match="data.video_fps"):
        validate(PPOConfig(data=DataConfig(video_fps=0.0)))


def test_video_placeholders_must_match_the_videos(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    video = {"bytes": encode_video(_frames(4), fps=2)}
    good = {"problem": "<video>Which way?", "answer": "left", "videos": [video]}
    bad_rows = [
        {**good, "problem": "Which way?"},
        {**good, "problem": "<video><video>Which way?"},
        {**good, "videos": []},
    ]
    for i, row in enumerate(bad_rows):
        path = _parquet(tmp_path / f"m{i}.parquet", [good, good, row])
        where = re.escape(f"{path} row 2")
        with pytest.raises(DatasetError, match=rf"{where}: \d video\(s\) but \d <video> placeholder"):
            _load(path, "qwen2_vl", tiny_model)
    broken = _parquet(tmp_path / "broken.parquet", [good, {**good, "videos": [{"bytes": b"not a video"}]}])
    with pytest.raises(DatasetError, match=re.escape(f"{broken} row 1: video 0: cannot read video bytes")):
        _load(broken, "qwen2_vl", tiny_model)
    missing = _parquet(tmp_path / "missing.parquet", [{**good, "videos": ["nope.mp4"]}])
    with pytest.raises(DatasetError, match=r"row 0: video 0: no such video file: .*nope\.mp4"):
        _load(missing, "qwen2_vl", tiny_model, image_dir=str(tmp_path))
    tokenizer = load_tokenizer(tiny_model("qwen2"))
    with pytest.raises(DatasetError, match="row 0: has videos, but the model is text-only"):
        RLDataset(str(_parquet(tmp_path / "g.parquet", [good])), tokenizer, None, _config())


def test_the_overlong_filter_counts_video_tokens(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    short, long = encode_video(_frames(4), fps=2), encode_video(_frames(16), fps=2)  # 8 and 32 video tokens
    rows = [
        {"problem": "<video>Which way?", "answer": "a", "videos": [{"bytes": short}]},
        {"problem": "<video>Which way?", "answer": "b", "videos": [{"bytes": long}]},
        {"problem": "Which way?", "answer": "c", "videos": []},
    ]
    path = _parquet(tmp_path / "lengths.parquet", rows)
    full = _load(path, "qwen2_5_vl", tiny_model)
    lengths = [full.prompt_length(row) for row in range(3)]
    assert lengths[1] - lengths[0] == 24 and lengths[0] > lengths[2]
    kept = _load(path, "qwen2_5_vl", tiny_model, max_prompt_length=lengths[0])
    assert [item["ground_truth"] for item in kept] == ["a", "c"] and kept.filtered == 1


# ---- the processor ------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", VISION)
def test_two_identical_frames_are_an_image(tiny_model: Callable[[str], Path], arch: str) -> None:
    """The image processor repeats an image over the temporal patch: a video of that image twice has
    the same pixel rows, grid and token count, and the vision tower gives the same features."""
    path = tiny_model(arch)
    processor, model = load_processor(path), load_model(path)
    factor = processor.video_processor.patch_size * processor.video_processor.merge_size
    frame = _frames(1, size=(3 * factor, 2 * factor))[0]
    image = processor.image_processor(images=[frame], return_tensors="pt")
    video = processor.video_processor(videos=[np.stack([np.asarray(frame)] * 2)], video_metadata=[None])
    torch.testing.assert_close(video["pixel_values_videos"], image["pixel_values"])
    assert video["video_grid_thw"].tolist() == image["image_grid_thw"].tolist() == [[1, 4, 6]]
    with torch.no_grad():
        got = model.model.get_video_features(video["pixel_values_videos"], video["video_grid_thw"])
        want = model.model.get_image_features(image["pixel_values"], image["image_grid_thw"])
    torch.testing.assert_close(got.pooler_output, want.pooler_output)


@pytest.mark.parametrize("arch", VISION)
def test_video_token_counts_follow_the_family_formula(tiny_model: Callable[[str], Path], arch: str) -> None:
    """(T / temporal patch) x (H / 28) x (W / 28) tokens (32 for Qwen3-VL, whose 16-pixel patches merge 2 x 2),
    with the frames resized to multiples of that within the processor's bounds."""
    path = tiny_model(arch)
    processor = load_processor(path)
    tokenizer = processor.tokenizer
    side = 32 if arch == "qwen3_vl" else 28
    for count, (width, height) in ((4, (56, 56)), (6, (84, 56)), (3, (100, 60))):
        frames = np.stack([np.asarray(f) for f in _frames(count, (width, height))])
        video = Video(frames, 2.0, count, tuple(range(count)))
        text = "<|vision_start|><|video_pad|><|vision_end|>Which way?"
        out = processor(text=[text], videos=[frames], video_metadata=[video.metadata()], return_tensors="pt")
        h, w = processor.video_processor.target_size(count, height, width)
        assert h % side == 0 and w % side == 0
        expected = -(-count // 2) * (h // side) * (w // side)
        assert (
            int((out["input_ids"][0] == tokenizer.convert_tokens_to_ids("<|video_pad|>")).sum()) == expected
        )
        assert out["pixel_values_videos"].shape[0] == expected * 4


def test_qwen3_vl_equals_its_transformers_video_processor(tiny_model: Callable[[str], Path]) -> None:
    """transformers' Qwen3-VL processor with its own video processor, on frames already at a size it
    keeps (resizing and normalizing are what need torchvision): the same ids, frame timestamps
    included, the same pixel rows (rescaled, not normalized on both sides) and grids."""
    path = tiny_model("qwen3_vl")
    ours = load_processor(path)
    settings = ours.video_processor
    # Qwen3VLProcessor's own constructor checks the video processor's class through a mapping that
    # needs torchvision, so the reference video processor is put in place as the loader puts ours.
    reference = Qwen3VLImageOnlyProcessor(
        ours.image_processor, ours.tokenizer, chat_template=ours.chat_template
    )
    reference.video_processor = Qwen3VLVideoProcessor(
        patch_size=16, size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels}
    )
    plain = FrameVideoProcessor(**{**settings.__dict__, "image_mean": (0.0,) * 3, "image_std": (1.0,) * 3})
    text = "<|vision_start|><|video_pad|><|vision_end|>Which way?<|vision_start|><|video_pad|><|vision_end|>"
    videos = [
        Video(np.stack([np.asarray(f) for f in _frames(4, (64, 64))]), 10.0, 40, (0, 13, 26, 39)),
        Video(np.stack([np.asarray(f) for f in _frames(6, (96, 64), seed=1)]), 3.0, 6, tuple(range(6))),
    ]
    frames, metadata = [v.frames for v in videos], [v.metadata() for v in videos]
    want = reference(
        text=[text],
        videos=frames,
        video_metadata=metadata,
        return_tensors="pt",
        do_resize=False,
        do_normalize=False,
        do_convert_rgb=False,
        do_sample_frames=False,
        cap_pixels_per_frame=False,
    )
    ours.video_processor = plain
    got = ours(text=[text], videos=frames, video_metadata=metadata, return_tensors="pt")
    assert got["input_ids"].tolist() == want["input_ids"].tolist()
    assert "<0.7 seconds>" in ours.tokenizer.decode(got["input_ids"][0])  # frames 0 and 13 at 10 fps: 0.65 s
    assert got["video_grid_thw"].tolist() == want["video_grid_thw"].tolist() == [[2, 4, 4], [3, 4, 6]]
    torch.testing.assert_close(got["pixel_values_videos"], want["pixel_values_videos"])


def test_processor_settings_come_from_the_video_config(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """A downloaded Qwen-VL folder has a video_preprocessor_config.json; its bounds and statistics win."""
    folder = tmp_path / "with_video_config"
    folder.mkdir()
    for file in tiny_model("qwen2_5_vl").iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = {
        "size": {"shortest_edge": 4 * 784, "longest_edge": 16 * 784},
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.1, 0.2, 0.3],
        "image_std": [0.5, 0.5, 0.5],
        "video_processor_type": "Qwen2VLVideoProcessor",
    }
    (folder / "video_preprocessor_config.json").write_text(json.dumps(config))
    video = load_processor(folder).video_processor
    assert (video.min_pixels, video.max_pixels, video.image_mean) == (3136, 12544, (0.1, 0.2, 0.3))
    assert (
        not video.whole_video_bounds
        and load_processor(tiny_model("qwen3_vl")).video_processor.whole_video_bounds
    )


# ---- the model: positions, the packed forward, the rollout ---------------------------------------


def _mixed_items(path: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """Six dataset items of ``mixed_media``: text, image and video prompts."""
    write_task("mixed_media", tmp_path / "mixed", n_train=6, n_test=2, seed=3)
    dataset = RLDataset(f"{tmp_path / 'mixed'}@train", load_tokenizer(path), load_processor(path), _config())
    items = [dataset[i] for i in range(len(dataset))]
    kinds = {("videos" if item["videos"] else "images" if item["images"] else "text") for item in items}
    assert kinds == {"videos", "images", "text"}
    return items


@pytest.mark.parametrize("arch", VISION)
def test_packed_equals_padded_and_the_rollout_with_videos(
    tiny_model: Callable[[str], Path], arch: str, tmp_path: Path
) -> None:
    """A batch of text, image and video prompts: the Hugging Face rollout samples from it, and the
    actor's log-probs of those samples agree, padded (the model's own multimodal positions) and packed
    (``get_rope_index`` per sequence, with video grids and Qwen2.5-VL's seconds per grid)."""
    path = tiny_model(arch)
    items = _mixed_items(path, tmp_path)
    model = load_model(path).eval()
    tokenizer = load_tokenizer(path)
    torch.manual_seed(0)
    rollout = generate(
        model,
        items,
        SamplingParams(n=1, max_tokens=6, logprobs=True),
        pad_id=tokenizer.pad_token_id,
        eos_ids=[-1],
    )
    mask = torch.ones(len(items), 6)
    exp = Experience(
        rollout.prompt_ids,
        rollout.response_ids,
        [item["multi_modal_inputs"] for item in items],
        torch.arange(len(items)),
        mask,
    )
    install_scoring_head(model)
    with torch.no_grad():
        padded, _ = token_logprobs(
            model,
            exp,
            temperature=1.0,
            pad_id=tokenizer.pad_token_id,
            device=torch.device("cpu"),
            packed=False,
        )
        use_packed_attention(model)
        batch = scoring_batch(exp, tokenizer.pad_token_id, model, torch.device("cpu"), packed=True)
        assert batch.packed and batch.inputs["position_ids"].shape[0] == 4
        packed, _ = token_logprobs(
            model,
            exp,
            temperature=1.0,
            pad_id=tokenizer.pad_token_id,
            device=torch.device("cpu"),
            packed=True,
        )
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)
    torch.testing.assert_close(padded, torch.stack(rollout.logprobs), rtol=0, atol=1e-4)


# ---- vLLM's requests (pure functions; vLLM itself needs a GPU) -----------------------------------


@pytest.mark.parametrize("arch", ("qwen2_5_vl", "qwen3_vl"))
def test_vllm_prompt_with_videos(tiny_model: Callable[[str], Path], arch: str, tmp_path: Path) -> None:
    """The unexpanded prompt's ids (vLLM expands each video itself, Qwen3-VL's timestamps included),
    the frames as the dataset sampled them with their metadata, and no resampling by vLLM."""
    path = tiny_model(arch)
    tokenizer = load_tokenizer(path)
    items = _mixed_items(path, tmp_path)
    video_item = next(item for item in items if item["videos"])
    request = vllm_prompt(
        video_item, image_token_id=None, tokenizer=tokenizer, limit_videos=1, model_type=arch
    )
    ids = request["prompt_token_ids"]
    assert ids == tokenizer(video_item["prompt"], add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|video_pad|>")) == 1
    assert len(ids) < len(video_item["input_ids"])
    [(frames, metadata)] = request["multi_modal_data"]["video"]
    assert frames.shape == (VIDEO_FRAMES, 56, 56, 3) and frames.dtype == np.uint8
    assert metadata["fps"] == VIDEO_FPS and metadata["frames_indices"] == [0, 1, 2, 3]
    expected = {"do_sample_frames": False}
    if arch == "qwen2_5_vl":  # vLLM's Qwen2.5-VL parser drops the tuple's metadata
        expected["video_metadata"] = [metadata]
    assert request["mm_processor_kwargs"] == expected
    with pytest.raises(ConfigError, match=r"worker.rollout.limit_videos=0: a prompt has 1 video"):
        vllm_prompt(video_item, image_token_id=None, tokenizer=tokenizer, limit_videos=0)
    image_item = next(item for item in items if item["images"])
    assert vllm_prompt(image_item, load_model(path).config.image_token_id)["multi_modal_data"] == {
        "image": image_item["images"]
    }
    kwargs = engine_kwargs(
        RolloutConfig(limit_images=2, limit_videos=1, free_cache_engine=True),
        model_path="m",
        tokenizer_path="t",
        max_model_len=768,
        trust_remote_code=False,
        multimodal=True,
    )
    assert kwargs["limit_mm_per_prompt"] == {"image": 2, "video": 1} and "mm_processor_cache_gb" not in kwargs
    several = engine_kwargs(
        RolloutConfig(limit_videos=2, free_cache_engine=True),
        model_path="m",
        tokenizer_path="t",
        max_model_len=768,
        trust_remote_code=False,
        multimodal=True,
    )
    assert several["mm_processor_cache_gb"] == 0  # per-request metadata: no partial cache hits
    config = PPOConfig()
    config.worker.rollout.limit_videos = -1
    with pytest.raises(ConfigError, match="worker.rollout.limit_videos"):
        validate(config)


# ---- the synthetic task -------------------------------------------------------------------------


def _direction(frames: np.ndarray) -> str:
    """The bar's direction, recomputed from decoded pixels: the centroid of the dark pixels (the
    bar; the backgrounds are light) in the first and the last frame."""
    centroids = []
    for frame in (frames[0], frames[-1]):
        ys, xs = np.nonzero(frame.astype(int).mean(-1) < 128)
        centroids.append((xs.mean(), ys.mean()))
    dx, dy = centroids[1][0] - centroids[0][0], centroids[1][1] - centroids[0][1]
    if abs(dx) > abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


@pytest.mark.parametrize("difficulty", [1, 2])
def test_moving_bar_answers_check_out_and_splits_are_disjoint(tmp_path: Path, difficulty: int) -> None:
    files = write_task("moving_bar", tmp_path, n_train=40, n_test=20, seed=0, difficulty=difficulty)
    table = {split: pq.read_table(path).to_pylist() for split, path in files.items()}
    answers = set()
    for rows in table.values():
        for row in rows:
            [video] = row["videos"]
            with av.open(io.BytesIO(video["bytes"])) as container:
                frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
            assert frames.shape == (VIDEO_FRAMES, 56, 56, 3)
            assert _direction(frames) == row["answer"]
            assert row["problem"].startswith("<video>") and row["guess"] in ("left", "right", "up", "down")
            answers.add(row["answer"])
    assert answers == ({"left", "right"} if difficulty == 1 else {"left", "right", "up", "down"})
    videos = {split: {row["videos"][0]["bytes"] for row in rows} for split, rows in table.items()}
    assert not videos["train"] & videos["test"]
    rows = make_rows("moving_bar", 40, 20, seed=0, difficulty=difficulty)
    assert not {r.key for r in rows["train"]} & {r.key for r in rows["test"]}


def test_fading_answers_check_out_and_one_frame_does_not_tell(tmp_path: Path) -> None:
    """The answer recomputed from decoded pixels (mean brightness of the last frame against the
    first); a single frame's brightness is spread alike for both answers, and splits are disjoint."""
    files = write_task("fading", tmp_path, n_train=60, n_test=20, seed=0)
    firsts: dict[str, list[float]] = {"brighter": [], "darker": []}
    for path in files.values():
        for row in pq.read_table(path).to_pylist():
            [video] = row["videos"]
            with av.open(io.BytesIO(video["bytes"])) as container:
                frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]).astype(
                    float
                )
            assert frames.shape == (VIDEO_FRAMES, 56, 56, 3)
            assert ("brighter" if frames[-1].mean() > frames[0].mean() else "darker") == row["answer"]
            firsts[row["answer"]].append(
                frames[1:3].mean()
            )  # the middle frames: the level, whatever the direction
    assert abs(np.mean(firsts["brighter"]) - np.mean(firsts["darker"])) < 10
    rows = make_rows("fading", 60, 20, seed=0)
    assert not {r.key for r in rows["train"]} & {r.key for r in rows["test"]}


def test_vllm_video_kwargs_give_the_actors_second_per_grid_ts(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """What vLLM's Qwen2.5-VL processor sees (the frames without the tuple's metadata, since its parser
    has no ``video_needs_metadata``, plus ``mm_processor_kwargs``) gives the actor's ``second_per_grid_ts``
    and so the same M-RoPE positions; bare frames would give 2/24 (transformers' 24 fps default)."""
    path = tiny_model("qwen2_5_vl")
    processor, tokenizer = load_processor(path), load_tokenizer(path)
    item = next(item for item in _mixed_items(path, tmp_path) if item["videos"])
    actor = item["multi_modal_inputs"]["second_per_grid_ts"]
    request = vllm_prompt(
        item, image_token_id=None, tokenizer=tokenizer, limit_videos=1, model_type="qwen2_5_vl"
    )
    frames = [frames for frames, _ in request["multi_modal_data"]["video"]]  # what vLLM's parser keeps
    kwargs = request["mm_processor_kwargs"]
    assert kwargs["do_sample_frames"] is False
    # transformers' video processor turns the kwarg (or, without one, defaults) into VideoMetadata;
    # the project's FrameVideoProcessor needs it done here.
    text = tokenizer.decode(request["prompt_token_ids"])
    given = make_batched_metadata(frames, video_metadata=kwargs.get("video_metadata"))
    seen = processor(text=[text], videos=frames, video_metadata=given, return_tensors="pt")
    assert torch.allclose(torch.as_tensor(seen["second_per_grid_ts"]), torch.as_tensor(actor))
    bare = processor(
        text=[text], videos=frames, video_metadata=make_batched_metadata(frames, None), return_tensors="pt"
    )
    assert not torch.allclose(torch.as_tensor(bare["second_per_grid_ts"]), torch.as_tensor(actor))
