"""Synthetic tasks: deterministic, disjoint splits, and answers that match what is drawn."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from easyr1.data.synthetic import IMAGE_DIR, TASKS, write_task
from easyr1.rewards.math import accuracy_score


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _components(image: Image.Image) -> int:
    """Count 4-connected regions of non-background pixels (background = the corner colour)."""
    pixels = np.asarray(image.convert("RGB")).astype(int)
    foreground = np.abs(pixels - pixels[0, 0]).sum(axis=2) > 0
    seen = np.zeros_like(foreground)
    height, width = foreground.shape
    count = 0
    for y, x in zip(*np.nonzero(foreground), strict=True):
        if seen[y, x]:
            continue
        count += 1
        stack = [(y, x)]
        seen[y, x] = True
        while stack:
            cy, cx = stack.pop()
            for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                if 0 <= ny < height and 0 <= nx < width and foreground[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
    return count


def _decode(entry: dict) -> Image.Image:
    return Image.open(io.BytesIO(entry["bytes"]))


@pytest.mark.parametrize("task", TASKS)
def test_deterministic_and_disjoint(task: str, tmp_path: Path) -> None:
    first = write_task(task, tmp_path / "a", n_train=40, n_test=12, seed=3)
    again = write_task(task, tmp_path / "b", n_train=40, n_test=12, seed=3)
    other = write_task(task, tmp_path / "c", n_train=40, n_test=12, seed=4)
    assert set(first) == {"train", "test"}
    for split in first:
        assert _rows(first[split]) == _rows(again[split])
    assert _rows(first["train"]) != _rows(other["train"])
    assert len(_rows(first["train"])) == 40 and len(_rows(first["test"])) == 12

    def key(row: dict) -> str:
        media = {name: [e["bytes"].hex() for e in row.get(name) or []] for name in ("images", "videos")}
        return json.dumps({**row, **media})

    train, test = {key(r) for r in _rows(first["train"])}, {key(r) for r in _rows(first["test"])}
    assert len(train) == 40 and len(test) == 12 and not train & test


def test_arithmetic_answers_and_difficulty(tmp_path: Path) -> None:
    rows = _rows(write_task("arithmetic", tmp_path / "d1", 100, 20)["train"])
    rows2 = _rows(write_task("arithmetic", tmp_path / "d2", 100, 20, difficulty=2)["train"])
    for row in rows + rows2:
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", row["problem"]).groups()
        assert row["answer"] == str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])
    assert set(rows[0]) == {"problem", "answer"}
    assert max(int(n) for r in rows for n in re.findall(r"\d+", r["problem"])) <= 9
    assert max(int(n) for r in rows2 for n in re.findall(r"\d+", r["problem"])) > 9
    with pytest.raises(ValueError, match="distinct problems"):
        write_task("arithmetic", tmp_path / "too_many", 300, 10)


def test_compare_answer_is_the_larger_and_guess_one_of_the_two(tmp_path: Path) -> None:
    files = write_task("compare", tmp_path, 300, 50, difficulty=2)
    rows = _rows(files["train"]) + _rows(files["test"])
    guesses_right = 0
    for row in rows:
        a, b = (
            int(n) for n in re.fullmatch(r"Which number is larger: (\d+) or (\d+)\?", row["problem"]).groups()
        )
        assert a != b and 10 <= min(a, b) and max(a, b) <= 99
        assert row["answer"] == str(max(a, b))
        assert row["guess"] in (str(a), str(b))
        guesses_right += row["guess"] == row["answer"]
    assert 0.4 < guesses_right / len(rows) < 0.6  # the teacher does not compare
    assert {r["problem"] for r in _rows(files["train"])}.isdisjoint(
        r["problem"] for r in _rows(files["test"])
    )
    with pytest.raises(ValueError, match="compare with difficulty=1 has only 90 distinct problems"):
        write_task("compare", tmp_path / "too_many", 80, 20)


@pytest.mark.parametrize("task", ["count_shapes", "multi_image"])
def test_answer_is_the_number_of_shapes_drawn(task: str, tmp_path: Path) -> None:
    rows = _rows(write_task(task, tmp_path, n_train=60, n_test=0)["train"])
    n_images = 1 if task == "count_shapes" else 2
    counts = set()
    for row in rows:
        assert row["problem"].count("<image>") == n_images == len(row["images"])
        images = [_decode(e) for e in row["images"]]
        assert all(im.size == (56, 56) and im.mode == "RGB" for im in images)
        assert row["answer"] == str(sum(_components(im) for im in images))
        counts.update(_components(im) for im in images)
    assert counts == {1, 2, 3, 4, 5}


def _colour_areas(image: Image.Image) -> dict[str, int]:
    """Pixels per colour, by the dominant channel (backgrounds are light, so no channel leads there)."""
    r, g, b = np.moveaxis(np.asarray(image.convert("RGB")).astype(int), 2, 0)
    return {"red": int((r - np.maximum(g, b) > 100).sum()), "blue": int((b - np.maximum(r, g) > 100).sum())}


@pytest.mark.parametrize("size", [56, 84])
def test_dominant_color_answer_is_the_colour_with_more_pixels(size: int, tmp_path: Path) -> None:
    files = write_task("dominant_color", tmp_path, n_train=200, n_test=50, seed=1, image_size=size)
    train, test = _rows(files["train"]), _rows(files["test"])
    guesses_right, orders, answers = 0, set(), set()
    for row in train + test:
        first, second = re.fullmatch(
            r"<image>Which colour covers more of the image: (\w+) or (\w+)\?", row["problem"]
        ).groups()
        assert {first, second} == {"red", "blue"}
        orders.add(first)
        image = _decode(row["images"][0])
        assert image.size == (size, size) and len(row["images"]) == 1
        area = _colour_areas(image)
        assert min(area.values()) > 0 and max(area.values()) >= 3 * min(area.values()), area
        assert row["answer"] == max(area, key=area.get)
        answers.add(row["answer"])
        assert row["guess"] in (first, second)
        guesses_right += row["guess"] == row["answer"]
        # The math reward grades the colour word exactly: the answer scores 1, the other option 0.
        other = second if row["answer"] == first else first
        assert accuracy_score(f"<think>x</think> \\boxed{{{row['answer'].upper()}}}", row["answer"]) == 1.0
        assert accuracy_score(f"<think>x</think> \\boxed{{{other}}}", row["answer"]) == 0.0
    assert orders == answers == {"red", "blue"}
    assert 0.4 < guesses_right / (len(train) + len(test)) < 0.6  # the teacher does not look
    assert {r["images"][0]["bytes"] for r in train}.isdisjoint(r["images"][0]["bytes"] for r in test)


def test_mixed_has_text_and_image_rows(tmp_path: Path) -> None:
    rows = _rows(write_task("mixed", tmp_path, n_train=40, n_test=5)["train"])
    with_images = [r for r in rows if r["images"]]
    assert 0 < len(with_images) < len(rows)
    assert all(r["problem"].count("<image>") == len(r["images"]) for r in rows)


def test_jsonl_stores_relative_image_paths(tmp_path: Path) -> None:
    files = write_task("multi_image", tmp_path, n_train=5, n_test=3, fmt="jsonl")
    assert files == {"train": tmp_path / "train.jsonl", "test": tmp_path / "test.jsonl"}
    parquet = _rows(write_task("multi_image", tmp_path / "pq", n_train=5, n_test=3)["train"])
    records = [json.loads(line) for line in files["train"].read_text().splitlines()]
    for record, row in zip(records, parquet, strict=True):
        assert record["answer"] == row["answer"]
        for name, entry in zip(record["images"], row["images"], strict=True):
            assert not Path(name).is_absolute()
            on_disk = Image.open(tmp_path / IMAGE_DIR / name)
            assert np.array_equal(np.asarray(on_disk), np.asarray(_decode(entry)))


def test_unknown_task_and_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="arithmetic, compare, count_shapes, multi_image, mixed"):
        write_task("sudoku", tmp_path, 1, 1)
    with pytest.raises(ValueError, match="parquet, jsonl"):
        write_task("arithmetic", tmp_path, 1, 1, fmt="csv")
