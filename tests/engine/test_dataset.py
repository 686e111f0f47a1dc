"""RLDataset on every EasyR1 dataset shape, against the offline tiny models."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from easyr1.data.config import DataConfig
from easyr1.data.dataset import DatasetError, RLDataset, make_dataloader
from easyr1.data.images import resize_image
from easyr1.data.synthetic import IMAGE_DIR, write_task
from easyr1.models.loading import load_processor, load_tokenizer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "format_prompt"
GENERATION_PROMPT = "<|im_start|>assistant\n"


def _config(**overrides: Any) -> DataConfig:
    values = {
        "prompt_key": "problem",
        "min_pixels": None,
        "max_pixels": None,
        "filter_overlong_prompts_workers": 1,
    }
    return DataConfig(**{**values, **overrides})


def _model(tiny_model, arch: str) -> tuple[Any, Any]:
    path = tiny_model(arch)
    return load_tokenizer(path), load_processor(path)


def _png(size: tuple[int, int], color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _image_tokens(item: dict, tokenizer) -> int:
    return int((item["input_ids"] == tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum())


@pytest.fixture(scope="module")
def vlm(tiny_model):
    return _model(tiny_model, "qwen2_5_vl")


# ----------------------------------------------------------------------------- dataset shapes


def test_text_dataset(tiny_model, tmp_path: Path) -> None:
    tokenizer, processor = _model(tiny_model, "qwen2")
    assert processor is None
    files = write_task("arithmetic", tmp_path, n_train=12, n_test=4)
    data = RLDataset(str(files["train"]), tokenizer, None, _config())
    source = pq.read_table(files["train"]).to_pylist()
    assert len(data) == 12
    item = data[5]
    assert item["prompt"].endswith(GENERATION_PROMPT) and source[5]["problem"] in item["prompt"]
    assert item["input_ids"].dtype == torch.long and item["input_ids"].dim() == 1
    assert item["input_ids"].tolist() == tokenizer(item["prompt"], add_special_tokens=False)["input_ids"]
    assert (item["ground_truth"], item["index"]) == (source[5]["answer"], 5)
    assert item["images"] == [] and item["multi_modal_inputs"] == {}


@pytest.mark.parametrize(
    "arch, size", [("qwen2_vl", (112, 56)), ("qwen2_5_vl", (112, 56)), ("qwen3_vl", (128, 64))]
)
def test_image_tokens_counted_in_prompt_length(tiny_model, tmp_path: Path, arch: str, size) -> None:
    tokenizer, processor = _model(tiny_model, arch)
    path = _parquet(
        tmp_path / "one.parquet",
        [{"problem": "<image>Describe it.", "answer": 1, "images": [{"bytes": _png(size)}]}],
    )
    item = RLDataset(str(path), tokenizer, processor, _config())[0]
    unit = 28 if arch != "qwen3_vl" else 32  # pixels covered by one merged token
    expected = (size[0] // unit) * (size[1] // unit)
    assert _image_tokens(item, tokenizer) == expected == 8
    text_only = tokenizer(item["prompt"], add_special_tokens=False)["input_ids"]
    assert len(item["input_ids"]) == len(text_only) - 1 + expected  # one <|image_pad|> became `expected`
    assert RLDataset(str(path), tokenizer, processor, _config()).prompt_length(0) == len(item["input_ids"])
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [
        [1, size[1] * 2 // unit, size[0] * 2 // unit]
    ]
    assert "input_ids" not in item["multi_modal_inputs"] and item["ground_truth"] == 1


def test_single_image_parquet_with_bytes(vlm, tmp_path: Path) -> None:
    tokenizer, processor = vlm
    files = write_task("count_shapes", tmp_path, n_train=6, n_test=2)
    data = RLDataset(f"{files['test']}@test", tokenizer, processor, _config())
    assert len(data) == 2
    item = data[1]
    assert item["prompt"].endswith(GENERATION_PROMPT)
    assert item["prompt"].count("<|vision_start|><|image_pad|><|vision_end|>") == 1
    assert [im.size for im in item["images"]] == [(56, 56)] and item["images"][0].mode == "RGB"
    assert set(item["multi_modal_inputs"]) == {"pixel_values", "image_grid_thw"}


def test_pil_images_from_hf_image_feature(vlm, tmp_path: Path) -> None:
    """Parquet written by `datasets` with an Image feature stores {"bytes", "path"}; it loads as PIL."""
    tokenizer, processor = vlm
    features = datasets.Features(
        {
            "problem": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "images": datasets.List(datasets.Image()),
        }
    )
    rows = {"problem": ["<image>Count."], "answer": ["2"], "images": [[Image.new("L", (56, 84), 90)]]}
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "hf.parquet"))
    item = RLDataset(str(tmp_path / "hf.parquet"), tokenizer, processor, _config())[0]
    assert item["images"][0].mode == "RGB" and item["images"][0].size == (56, 84)
    assert _image_tokens(item, tokenizer) == 6


def test_multi_image_jsonl_with_image_dir_keeps_order(vlm, tmp_path: Path) -> None:
    tokenizer, processor = vlm
    files = write_task("multi_image", tmp_path, n_train=3, n_test=1, fmt="jsonl")
    data = RLDataset(str(files["train"]), tokenizer, processor, _config(image_dir=str(tmp_path / IMAGE_DIR)))
    item = data[0]
    assert len(item["images"]) == 2 and item["multi_modal_inputs"]["image_grid_thw"].shape == (2, 3)
    assert _image_tokens(item, tokenizer) == 8
    # Text around and between placeholders stays in place.
    (tmp_path / "pics").mkdir()
    for name, size in (("a.png", (56, 56)), ("b.png", (112, 56))):
        (tmp_path / "pics" / name).write_bytes(_png(size))
    row = {"problem": "First<image>then<image>end", "answer": "x", "images": ["a.png", "b.png"]}
    path = _parquet(tmp_path / "order.parquet", [row])
    item = RLDataset(str(path), tokenizer, processor, _config(image_dir=str(tmp_path / "pics")))[0]
    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    assert f"First{vision}then{vision}end" in item["prompt"]
    assert [im.size for im in item["images"]] == [(56, 56), (112, 56)]


def test_mixed_rows(vlm, tmp_path: Path) -> None:
    tokenizer, processor = vlm
    files = write_task("mixed", tmp_path, n_train=10, n_test=2)
    data = RLDataset(str(files["train"]), tokenizer, processor, _config())
    items = [data[i] for i in range(len(data))]
    text = [it for it in items if not it["images"]]
    image = [it for it in items if it["images"]]
    assert text and image
    assert all(it["multi_modal_inputs"] == {} and _image_tokens(it, tokenizer) == 0 for it in text)
    assert all(_image_tokens(it, tokenizer) == 4 for it in image)
    batch = next(iter(make_dataloader(data, batch_size=4, shuffle=False, seed=0, drop_last=False)))
    assert batch["index"] == [0, 1, 2, 3] and isinstance(batch["input_ids"], list)
    assert [len(x) for x in batch["input_ids"]] == [len(it["input_ids"]) for it in items[:4]]


def test_folder_and_split_selection(vlm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer, processor = vlm
    write_task("arithmetic", tmp_path / "plain", n_train=7, n_test=3)

    def load(path: str) -> RLDataset:
        return RLDataset(path, tokenizer, processor, _config())

    assert len(load(str(tmp_path / "plain"))) == 7  # a folder alone is its train split
    assert len(load(f"{tmp_path / 'plain'}@test")) == 3
    with pytest.raises(DatasetError, match=r"no file of split 'validation'.*train\.parquet"):
        load(f"{tmp_path / 'plain'}@validation")
    # Sharded files; error rows name the shard and the row within it.
    shards = tmp_path / "shards"
    (shards / "data").mkdir(parents=True)
    for i in range(2):
        _parquet(
            shards / "data" / f"train-0000{i}-of-00002.parquet",
            [{"problem": f"Q{i}{j}", "answer": j} for j in range(3)],
        )
    _parquet(shards / "data" / "test-00000-of-00001.parquet", [{"problem": "T", "answer": 0}])
    data = load(f"{shards}@train")
    assert len(data) == 6 and [data[i]["index"] for i in range(6)] == list(range(6))
    assert "Q10" in data[3]["prompt"] and data[3]["ground_truth"] == 0
    # A folder of files without split names is all train.
    unnamed = tmp_path / "unnamed"
    unnamed.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (unnamed / name).write_text('{"problem": "P", "answer": "1"}\n')
    assert len(load(str(unnamed))) == 2 and len(load(f"{unnamed}@train")) == 2
    # @split on a file: ignored unless the file's name says it is another split.
    assert len(load(f"{tmp_path / 'plain' / 'train.parquet'}@train")) == 7
    (tmp_path / "plain" / "train.parquet").rename(tmp_path / "data.parquet")
    assert len(load(f"{tmp_path / 'data.parquet'}@test")) == 7
    with pytest.raises(DatasetError, match=r"test\.parquet is the 'test' split, not 'train'"):
        load(f"{tmp_path / 'plain' / 'test.parquet'}@train")
    with pytest.raises(DatasetError, match="no such file"):
        load(str(tmp_path / "missing.parquet"))
    # A relative folder of three parts is never a hub name (name or org/name): missing, it is said so.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match="data/mine/train@train: no such file or folder"):
        load("data/mine/train@train")


def test_json_array_file(vlm, tmp_path: Path) -> None:
    tokenizer, processor = vlm
    (tmp_path / "rows.json").write_text('[{"problem": "A?", "answer": 3}, {"problem": "B?", "answer": 4}]')
    data = RLDataset(str(tmp_path / "rows.json"), tokenizer, processor, _config())
    assert [data[i]["ground_truth"] for i in range(2)] == [3, 4]


def test_structured_answers_reach_the_reward_as_stored(vlm, tmp_path: Path) -> None:
    """EasyR1 hands the answer column to the reward as it is stored: a grounding reward reads a
    box from a dict, a multi-answer one a list (they used to arrive as their Python repr)."""
    tokenizer, processor = vlm
    for name, answers in {
        "boxes": [{"label": "cat", "bbox": [1, 2, 3, 4]}, {"label": "dog", "bbox": [5, 6, 7, 8]}],
        "choices": [["2", "n2"], ["3"]],
    }.items():
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"problem": "Which?", "answer": a}) + "\n" for a in answers)
        )
        data = RLDataset(str(tmp_path / f"{name}.jsonl"), tokenizer, processor, _config())
        assert [data[i]["ground_truth"] for i in range(2)] == answers


@pytest.mark.parametrize("gap", ["", "\n"], ids=["adjacent", "blank-line-between"])
def test_json_answers_mixing_text_and_numbers_are_refused(vlm, tmp_path: Path, gap: str) -> None:
    """A JSON key of text mixed with numbers: `datasets` 4.0 cannot read it, later ones decode the
    text as JSON too ("0.50" became 0.5, "007" 7). Refused either way, naming a row of each kind."""
    tokenizer, processor = vlm
    (tmp_path / "mixed.jsonl").write_text(
        f'{{"problem": "a", "answer": "0.50"}}\n{gap}{{"problem": "b", "answer": 7}}\n'
    )
    line = 3 if gap else 2
    with pytest.raises(
        DatasetError,
        match=rf"mixed.jsonl: 'answer' mixes text \(row 0, line 1\) with a int \(row 1, line {line}\)",
    ):
        RLDataset(str(tmp_path / "mixed.jsonl"), tokenizer, processor, _config())
    # Text beside null (a missing value) is no mix: the missing answer is what is named.
    (tmp_path / "gap.jsonl").write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": null}\n')
    with pytest.raises(DatasetError, match="gap.jsonl row 1: answer 'answer' is missing"):
        RLDataset(str(tmp_path / "gap.jsonl"), tokenizer, processor, _config())


def test_a_line_that_is_not_json_is_named(vlm, tmp_path: Path) -> None:
    tokenizer, processor = vlm
    (tmp_path / "cut.jsonl").write_text(
        '{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": "2"}\n{"problem": "c",\n'
    )
    with pytest.raises(DatasetError, match=r"cut.jsonl: line 3: not JSON: Expecting property name"):
        RLDataset(str(tmp_path / "cut.jsonl"), tokenizer, processor, _config())


# ----------------------------------------------------------------------------- transformations


def test_min_max_pixels_resize(vlm, tmp_path: Path) -> None:
    image = Image.new("RGB", (100, 50))
    assert resize_image(image, None, 1250).size == (50, 25)
    assert resize_image(image, 20000, None).size == (200, 100)
    assert resize_image(image, 100, 10000).size == (100, 50)
    odd = resize_image(Image.new("RGB", (97, 41)), 5000, 9000)
    assert 5000 <= odd.size[0] * odd.size[1] <= 9000 and abs(odd.size[0] / odd.size[1] - 97 / 41) < 0.05
    tokenizer, processor = vlm
    path = _parquet(
        tmp_path / "big.parquet",
        [{"problem": "<image>?", "answer": 1, "images": [{"bytes": _png((448, 224))}]}],
    )
    item = RLDataset(str(path), tokenizer, processor, _config(max_pixels=112 * 56))[0]
    assert item["images"][0].size == (112, 56) and _image_tokens(item, tokenizer) == 8
    item = RLDataset(str(path), tokenizer, processor, _config(min_pixels=896 * 448, max_pixels=None))[0]
    assert item["images"][0].size == (896, 448)


def test_format_prompt(vlm, tmp_path: Path) -> None:
    tokenizer, processor = vlm
    files = write_task("count_shapes", tmp_path, n_train=2, n_test=1)
    data = RLDataset(
        str(files["train"]), tokenizer, processor, _config(format_prompt=str(EXAMPLES / "r1v.jinja"))
    )
    item = data[0]
    assert re.search(r"How many shapes are in the image\? .*<think>.*<answer>", item["prompt"])
    assert _image_tokens(item, tokenizer) == 4
    math = write_task("arithmetic", tmp_path / "math", n_train=2, n_test=1)
    item = RLDataset(
        str(math["train"]), tokenizer, processor, _config(format_prompt=str(EXAMPLES / "math.jinja"))
    )[0]
    assert "\\boxed{}" in item["prompt"] and "<think>" in item["prompt"]
    item = RLDataset(
        str(math["train"]), tokenizer, processor, _config(format_prompt=str(EXAMPLES / "dapo.jinja"))
    )[0]
    assert "Answer: $Answer" in item["prompt"]


def test_override_chat_template(vlm, tmp_path: Path) -> None:
    tokenizer, processor = vlm
    template = tmp_path / "chat.jinja"
    template.write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
    )
    files = write_task("arithmetic", tmp_path, n_train=2, n_test=1)
    item = RLDataset(
        str(files["train"]), tokenizer, processor, _config(override_chat_template=str(template))
    )[0]
    assert re.fullmatch(r"\[user\] What is .*\?\n\[assistant\] ", item["prompt"])


def test_filter_overlong_prompts(vlm, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tokenizer, processor = vlm
    rows = [
        {"problem": "Short?", "answer": 1},
        {"problem": "long " * 200, "answer": 2},
        {"problem": "Tiny?", "answer": 3},
    ]
    path = _parquet(tmp_path / "rows.parquet", rows)
    with caplog.at_level("INFO", logger="easyr1.data.dataset"):
        data = RLDataset(str(path), tokenizer, processor, _config(max_prompt_length=64))
    assert len(data) == 2 and [data[i]["index"] for i in range(2)] == [0, 2]
    assert "dropped 1 of 3" in caplog.text
    kept_all = RLDataset(
        str(path), tokenizer, processor, _config(max_prompt_length=64, filter_overlong_prompts=False)
    )
    assert len(kept_all) == 3 and kept_all[0]["index"] == 0
    with pytest.raises(
        DatasetError,
        match=rf"{re.escape(str(path))} row 1: the prompt has \d+ tokens, more than max_prompt_length=64",
    ):
        kept_all[1]
    # Image tokens count: 4 tokens fit a limit that 64 (a 224x224 image) do not.
    images = [
        {"problem": "<image>?", "answer": i, "images": [{"bytes": _png(s)}]}
        for i, s in enumerate([(56, 56), (224, 224)])
    ]
    path = _parquet(tmp_path / "images.parquet", images)
    data = RLDataset(str(path), tokenizer, processor, _config(max_prompt_length=40))
    assert len(data) == 1 and data[0]["index"] == 0
    with pytest.raises(DatasetError, match=r"empty after filtering: all 2 prompts"):
        RLDataset(str(path), tokenizer, processor, _config(max_prompt_length=5))


def test_filter_with_worker_processes(vlm, tmp_path: Path) -> None:
    tokenizer, processor = vlm
    files = write_task("arithmetic", tmp_path, n_train=600, n_test=0, difficulty=2)
    serial = RLDataset(str(files["train"]), tokenizer, processor, _config(max_prompt_length=14))
    forked = RLDataset(
        str(files["train"]),
        tokenizer,
        processor,
        _config(max_prompt_length=14, filter_overlong_prompts_workers=2),
    )
    assert 0 < len(serial) < 600
    assert serial._rows == forked._rows


# ----------------------------------------------------------------------------- errors


def test_errors_name_file_and_row(vlm, tiny_model, tmp_path: Path) -> None:
    tokenizer, processor = vlm

    def load(path: Path, **kw: object) -> RLDataset:
        return RLDataset(str(path), tokenizer, processor, _config(**kw))

    def where(path: Path, row: int) -> str:
        return re.escape(f"{path} row {row}")

    good = {"problem": "<image>?", "answer": "1", "images": [{"bytes": _png((56, 56))}]}

    path = _parquet(tmp_path / "cols.parquet", [{"question": "Q", "answer": "1"}])
    with pytest.raises(
        DatasetError, match=rf"{re.escape(str(path))}: no column 'problem' \(columns: question, answer\)"
    ):
        load(path)

    path = _parquet(tmp_path / "bad_bytes.parquet", [good, {**good, "images": [{"bytes": b"not a png"}]}])
    with pytest.raises(DatasetError, match=rf"{where(path, 1)}: image 0: cannot read image bytes \(9 bytes"):
        load(path)

    path = _parquet(tmp_path / "bad_path.parquet", [{**good, "images": ["nowhere.png"]}])
    with pytest.raises(
        DatasetError, match=rf"{where(path, 0)}: image 0: cannot read image path 'nowhere.png'"
    ):
        load(path, image_dir=str(tmp_path))

    no_placeholder = {**good, "problem": "Count them."}
    two_placeholders = {**good, "problem": "<image><image>?"}
    text_with_placeholder = {"problem": "<image>?", "answer": "1", "images": []}
    for i, row in enumerate([no_placeholder, two_placeholders, text_with_placeholder]):
        path = _parquet(tmp_path / f"mismatch{i}.parquet", [good, good, row])
        with pytest.raises(
            DatasetError, match=rf"{where(path, 2)}: \d image\(s\) but \d <image> placeholder"
        ):
            load(path)
        lazy = load(path, filter_overlong_prompts=False)  # without the filter pass, the error comes on fetch
        with pytest.raises(DatasetError, match=where(path, 2)):
            lazy[2]

    path = _parquet(
        tmp_path / "videos.parquet",
        [{"problem": "Q", "answer": "1", "videos": []}, {"problem": "Q", "answer": "1", "videos": ["v.mp4"]}],
    )
    with pytest.raises(DatasetError, match=rf"{where(path, 1)}: 1 video\(s\) but 0 <video> placeholder"):
        load(path)

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetError, match="empty"):
        load(empty)
    path = _parquet(tmp_path / "empty.parquet", [good])
    pq.write_table(pq.read_table(path).slice(0, 0), path)
    with pytest.raises(DatasetError, match=rf"{re.escape(str(path))}: the dataset is empty"):
        load(path)

    text_tokenizer, _ = _model(tiny_model, "qwen2")
    path = _parquet(tmp_path / "text_model.parquet", [good])
    with pytest.raises(DatasetError, match=rf"{where(path, 0)}: has images, but the model is text-only"):
        RLDataset(str(path), text_tokenizer, None, _config())


# ----------------------------------------------------------------------------- loader state


def test_sampler_state_round_trip() -> None:
    data = [{"index": i} for i in range(10)]
    reference = make_dataloader(data, batch_size=3, shuffle=True, seed=7, drop_last=True)
    assert len(reference) == 3
    uninterrupted = [b["index"] for _ in range(3) for b in reference]  # 3 epochs
    for epoch in range(3):
        rows = [i for batch in uninterrupted[3 * epoch : 3 * epoch + 3] for i in batch]
        assert len(set(rows)) == 9 and set(rows) <= set(range(10))
    assert uninterrupted[:3] != uninterrupted[3:6]  # each epoch has its own order

    loader = make_dataloader(data, batch_size=3, shuffle=True, seed=7, drop_last=True)
    seen = [b["index"] for b in loader]  # epoch 0
    iterator = iter(loader)
    seen.append(next(iterator)["index"])  # one batch into epoch 1
    state = loader.state_dict()
    assert state == {"epoch": 1, "batch": 1, "size": 10}

    resumed = make_dataloader(data, batch_size=3, shuffle=True, seed=7, drop_last=True)
    resumed.load_state_dict(state)
    seen += [b["index"] for b in resumed]  # the rest of epoch 1
    seen += [b["index"] for b in resumed]  # epoch 2
    assert seen == uninterrupted
    assert resumed.state_dict() == {"epoch": 3, "batch": 0, "size": 10}

    # Rows added since the save: the saved position would name other rows in another order.
    grown = make_dataloader(data + [{"index": 10}], batch_size=3, shuffle=True, seed=7, drop_last=True)
    with pytest.raises(DatasetError, match="counts 10 rows; data.train_files now gives 11"):
        grown.load_state_dict(state)
    grown.load_state_dict({"epoch": 1, "batch": 1})  # a position saved before sizes were kept
    assert grown.state_dict() == {"epoch": 1, "batch": 1, "size": 11}

    ordered = make_dataloader(data, batch_size=-1, shuffle=False, seed=0, drop_last=False)
    assert [b["index"] for b in ordered] == [list(range(10))]
    assert [len(b["index"]) for b in make_dataloader(data, 4, False, 0, False)] == [4, 4, 2]
