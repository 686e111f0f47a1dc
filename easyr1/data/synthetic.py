"""Offline synthetic tasks in EasyR1's dataset format, for tests and baselines without a hub.

Every task is deterministic for a seed and has disjoint train and test splits (no problem,
image or video appears in both). Columns follow EasyR1's math12k / geometry3k: ``problem`` (with
one ``<image>`` per image and one ``<video>`` per video), ``answer`` (a number or word as a
string) and, for tasks with them, ``images`` and ``videos``. Parquet stores images as
``{"bytes": png}`` and videos as ``{"bytes": mp4}`` dicts; jsonl stores paths relative to
``out_dir / "images"`` (pass that folder as ``data.image_dir``; EasyR1 joins video paths with it
too). Videos are mp4 (x264 at qp 0 in 4:4:4: exact up to RGB/YUV rounding) at ``VIDEO_FPS`` frames per second.

Tasks:
- ``arithmetic``: "What is 7 + 5?"; ``difficulty`` sets the operand range (below 10**difficulty).
- ``compare``: "Which number is larger: 47 or 52?"; two different numbers below 10**difficulty.
  Unlike sums, whose held-out facts a tiny model has never seen, comparing digits is a rule it
  can learn from the training split and apply to unseen pairs, so RL can raise held-out accuracy.
  Rows also carry ``guess``: one of the two numbers at random, what a teacher that copies
  without comparing would answer. A warm start on ``guess`` (``--answer-key guess``) gives a
  model that answers in format with one of the two numbers, right half the time, and lacks
  only the comparison, which RL then has to learn from the reward.
- ``count_shapes``: one image with 1-5 filled shapes; "How many shapes are in the image?".
- ``multi_image``: two such images; the answer is the total count.
- ``dominant_color``: red and blue rectangles (shades vary) on a light background, one colour
  covering at least three times the area of the other; "Which colour covers more of the image:
  red or blue?" (options in random order), answered with the colour word, which the ``math``
  reward grades exactly (words compare as case-insensitive text). Counting shapes is beyond a
  tiny model (RL lowered its held-out accuracy on ``count_shapes``); which colour dominates is
  a sum over pixels that a tiny vision tower can represent, so RL can learn it from the reward
  and apply it to layouts it never saw. Rows carry ``guess`` as ``compare`` does: one of the
  two colours at random, for a warm start that teaches the format and leaves the looking to RL.
- ``mixed``: arithmetic and count_shapes rows in one file.
- ``moving_bar``: a video of ``VIDEO_FRAMES`` frames in which a dark bar moves steadily across
  the frame, left or right (for ``difficulty`` 2 also up or down); "Which way does the bar move:
  left or right?" (options in random order), answered with the direction word. Its width, speed,
  place and colours vary, and its path is centred on a point drawn independently of the
  direction, so no single frame tells the answer as well as comparing frames does. Rows carry
  ``guess`` as ``compare`` does.
- ``fading``: a video of ``VIDEO_FRAMES`` frames of a still picture (coloured rectangles on grey)
  whose brightness rises or falls steadily; "Does the picture get brighter or darker?" (options
  in random order), answered with the word. The brightness is centred on a level drawn
  independently of the direction, so no single frame tells the answer; the change between frames
  is in every pixel, which a tiny vision tower's patch embedding (two frames per temporal patch)
  represents at once, so RL can teach it to a tiny model. (``moving_bar`` is beyond a tiny model
  in a test's budget: 150 supervised steps on its true answers left held-out accuracy at 0.54.)
  Rows carry ``guess`` as ``compare`` does.
- ``mixed_media``: arithmetic, dominant_color and moving_bar rows in one file (text, image and
  video prompts in one batch).
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

from easyr1.data.videos import encode_video

TASKS = (
    "arithmetic",
    "compare",
    "count_shapes",
    "multi_image",
    "mixed",
    "dominant_color",
    "moving_bar",
    "fading",
    "mixed_media",
)
VIDEO_TASKS = ("moving_bar", "fading", "mixed_media")  # the tasks whose rows carry videos
SPLITS = ("train", "test")
IMAGE_DIR = "images"
"""Folder under ``out_dir`` that holds the PNG and mp4 files of a jsonl task."""
VIDEO_FPS = 2
VIDEO_FRAMES = 4

_BACKGROUNDS = ((255, 255, 255), (240, 240, 232), (232, 240, 248), (248, 236, 236))
_MIN_COLOR_DISTANCE = 120  # shapes stay clearly distinct from the background


@dataclass(frozen=True)
class Row:
    """One problem before serialisation: images as PIL, ``key`` identifies it for deduplication."""

    problem: str
    answer: str
    images: tuple[Image.Image, ...]
    key: tuple
    guess: str | None = None  # compare, dominant_color and moving_bar: an uninformed teacher's answer
    videos: tuple[tuple[Image.Image, ...], ...] = ()  # each video's frames


def _arithmetic(rng: random.Random, difficulty: int) -> Row:
    high = 10**difficulty
    op = rng.choice("+-*")
    a = rng.randrange(high)
    b = rng.randrange(2, 10) if op == "*" else rng.randrange(high)
    if op == "-" and b > a:
        a, b = b, a  # keep answers non-negative
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return Row(f"What is {a} {op} {b}?", str(answer), (), ("arith", a, op, b))


def _compare_numbers(difficulty: int) -> range:
    """Numbers with exactly ``difficulty`` digits (0-9 for 1)."""
    return range(10 ** (difficulty - 1) if difficulty > 1 else 0, 10**difficulty)


def _compare(rng: random.Random, difficulty: int) -> Row:
    a, b = rng.sample(_compare_numbers(difficulty), 2)
    guess = rng.choice((a, b))
    return Row(f"Which number is larger: {a} or {b}?", str(max(a, b)), (), ("compare", a, b), str(guess))


def _problem_space(task: str, difficulty: int) -> int | None:
    """How many distinct problems a task has at a difficulty (None: practically unbounded)."""
    if task == "arithmetic":
        high = 10**difficulty
        return high * high + high * (high + 1) // 2 + high * 8
    if task == "compare":
        count = len(_compare_numbers(difficulty))
        return count * (count - 1)
    return None


@dataclass(frozen=True)
class Shape:
    kind: str  # circle, square or triangle
    box: tuple[int, int, int, int]  # left, top, right, bottom (inclusive)
    color: tuple[int, int, int]


def _far_color(rng: random.Random, background: tuple[int, int, int]) -> tuple[int, int, int]:
    while True:
        color = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        if sum(abs(c - b) for c, b in zip(color, background, strict=True)) >= _MIN_COLOR_DISTANCE:
            return color


def _place_shapes(rng: random.Random, count: int, size: int, background) -> tuple[Shape, ...]:
    """Non-overlapping shapes with at least 2 background pixels between their boxes."""
    low, high = max(6, size // 7), max(8, size // 4)
    while True:  # restart when a layout gets stuck; fine for <= 5 shapes
        shapes: list[Shape] = []
        for _ in range(200):
            side = rng.randrange(low, high + 1)
            left, top = rng.randrange(1, size - side), rng.randrange(1, size - side)
            box = (left, top, left + side - 1, top + side - 1)
            if all(_apart(box, other.box) for other in shapes):
                kind = rng.choice(("circle", "square", "triangle"))
                shapes.append(Shape(kind, box, _far_color(rng, background)))
                if len(shapes) == count:
                    return tuple(shapes)


def _apart(a: tuple[int, int, int, int], b: tuple[int, int, int, int], gap: int = 2) -> bool:
    return a[2] + gap < b[0] or b[2] + gap < a[0] or a[3] + gap < b[1] or b[3] + gap < a[1]


def _draw(shapes: tuple[Shape, ...], size: int, background) -> Image.Image:
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    for shape in shapes:
        left, top, right, bottom = shape.box
        if shape.kind == "circle":
            draw.ellipse(shape.box, fill=shape.color)
        elif shape.kind == "square":
            draw.rectangle(shape.box, fill=shape.color)
        else:
            draw.polygon([((left + right) // 2, top), (left, bottom), (right, bottom)], fill=shape.color)
    return image


def _shapes_image(rng: random.Random, size: int) -> tuple[Image.Image, int, tuple]:
    background = rng.choice(_BACKGROUNDS)
    shapes = _place_shapes(rng, rng.randint(1, 5), size, background)
    return _draw(shapes, size, background), len(shapes), (background, shapes)


def _count_shapes(rng: random.Random, size: int) -> Row:
    image, count, key = _shapes_image(rng, size)
    return Row("<image>How many shapes are in the image?", str(count), (image,), ("shapes", key))


def _multi_image(rng: random.Random, size: int) -> Row:
    first, n1, k1 = _shapes_image(rng, size)
    second, n2, k2 = _shapes_image(rng, size)
    problem = "<image><image>How many shapes are there in the two images in total?"
    return Row(problem, str(n1 + n2), (first, second), ("two", k1, k2))


# Channel ranges per colour: shades vary per rectangle, so the skill is "reddish vs bluish", not
# one exact RGB value; every shade is far from the light backgrounds.
_SHADES = {"red": ((190, 256), (0, 70), (0, 70)), "blue": ((0, 70), (0, 90), (190, 256))}
_MIN_AREA_RATIO = 3  # the dominant colour covers at least this many times the other's area


def _dominant_color(rng: random.Random, size: int) -> Row:
    """Non-overlapping rectangles, each red or blue; the answer is the colour with more area,
    computed from the rectangles' geometry (the tests recount it from the pixels)."""
    background = rng.choice(_BACKGROUNDS)
    low, high = max(4, size // 8), max(6, size // 2)
    while True:  # resample until both colours appear and one clearly dominates
        boxes: list[tuple[int, int, int, int]] = []
        for _ in range(rng.randint(3, 8) * 10):  # placement attempts; overlapping ones are dropped
            width, height = rng.randrange(low, high + 1), rng.randrange(low, high + 1)
            left, top = rng.randrange(0, size - width + 1), rng.randrange(0, size - height + 1)
            box = (left, top, left + width - 1, top + height - 1)
            if all(_apart(box, other, gap=0) for other in boxes):
                boxes.append(box)
        names = [rng.choice(tuple(_SHADES)) for _ in boxes]
        area = dict.fromkeys(_SHADES, 0)
        for (left, top, right, bottom), name in zip(boxes, names, strict=True):
            area[name] += (right - left + 1) * (bottom - top + 1)
        small, large = sorted(area.values())
        if small > 0 and large >= _MIN_AREA_RATIO * small:
            break
    rects = tuple(
        (box, tuple(rng.randrange(*channel) for channel in _SHADES[name]))
        for box, name in zip(boxes, names, strict=True)
    )
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    for box, color in rects:
        draw.rectangle(box, fill=color)
    first, second = rng.sample(tuple(_SHADES), 2)
    problem = f"<image>Which colour covers more of the image: {first} or {second}?"
    answer = max(area, key=area.__getitem__)
    # Keyed by the image alone: a test image never reappears in train with the options swapped.
    return Row(problem, answer, (image,), ("dominant", background, rects), rng.choice((first, second)))


_DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
_DARK = 90  # every channel of the bar below this: darker than every background


def _moving_bar(rng: random.Random, size: int, difficulty: int) -> Row:
    """A dark bar across the whole frame on a light background, stepping ``step`` pixels per frame
    across it (a vertical bar moving left or right; for ``difficulty`` 2 also a horizontal bar moving
    up or down). Its path is centred on a point drawn independently of the direction, so the first
    (or last) frame alone hints at the answer only near the borders; the frames together always
    tell it. The bar is darker than the background, so where it arrives pixels darken and where it
    leaves they brighten, in every row it crosses: the direction is a linear function of two
    frames' difference, which a tiny vision tower's patch embedding (two frames per temporal patch)
    represents in every token."""
    names = ("left", "right") if difficulty <= 1 else tuple(_DIRECTIONS)
    direction = rng.choice(names)
    dx, dy = _DIRECTIONS[direction]
    width = rng.randint(max(2, size // 6), max(3, size // 3))
    step = rng.randint(max(1, size // 14), max(2, size // 7))
    travel = step * (VIDEO_FRAMES - 1)
    low, high = width // 2 + (travel + 1) // 2, size - width + width // 2 - (travel + 1) // 2
    centre = rng.randint(low, high)  # of the path, across the bar
    background = rng.choice(_BACKGROUNDS)
    color = tuple(rng.randrange(_DARK) for _ in range(3))
    frames = []
    for i in range(VIDEO_FRAMES):
        start = centre - width // 2 + (dx + dy) * round((i - (VIDEO_FRAMES - 1) / 2) * step)
        box = (start, 0, start + width - 1, size - 1) if dx else (0, start, size - 1, start + width - 1)
        image = Image.new("RGB", (size, size), background)
        ImageDraw.Draw(image).rectangle(box, fill=color)
        frames.append(image)
    first, second = rng.sample(names, 2) if difficulty <= 1 else (None, None)
    question = (
        f"Which way does the bar move: {first} or {second}?" if first else "Which way does the bar move?"
    )
    options = (first, second) if first else names
    key = ("bar", direction, width, step, centre, background, color)
    return Row(f"<video>{question}", direction, (), key, rng.choice(options), (tuple(frames),))


def _fading(rng: random.Random, size: int) -> Row:
    """Coloured rectangles on a grey field, the whole picture scaled by a gain that rises or falls
    steadily over the frames. The gains are centred on a level drawn independently of the direction,
    so one frame's brightness does not tell it; two frames' difference does, in every pixel."""
    scene = Image.new("RGB", (size, size), tuple([rng.randrange(120, 200)] * 3))
    draw = ImageDraw.Draw(scene)
    for _ in range(rng.randint(2, 5)):
        left, top = rng.randrange(size - 4), rng.randrange(size - 4)
        right, bottom = rng.randrange(left + 3, size), rng.randrange(top + 3, size)
        draw.rectangle((left, top, right, bottom), fill=tuple(rng.randrange(60, 256) for _ in range(3)))
    direction = rng.choice(("brighter", "darker"))
    sign = 1 if direction == "brighter" else -1
    level, step = rng.uniform(0.45, 0.75), rng.uniform(0.05, 0.1)
    pixels = np.asarray(scene, dtype=np.float32)
    frames = tuple(
        Image.fromarray(
            np.clip(pixels * (level + sign * (i - (VIDEO_FRAMES - 1) / 2) * step), 0, 255).astype(np.uint8)
        )
        for i in range(VIDEO_FRAMES)
    )
    first, second = rng.sample(("brighter", "darker"), 2)
    problem = f"<video>Does the picture get {first} or {second}?"
    key = ("fading", direction, round(level, 6), round(step, 6), scene.tobytes())
    return Row(problem, direction, (), key, rng.choice((first, second)), (frames,))


def _generator(task: str, difficulty: int, image_size: int) -> Callable[[random.Random], Row]:
    if task == "arithmetic":
        return lambda rng: _arithmetic(rng, difficulty)
    if task == "compare":
        return lambda rng: _compare(rng, difficulty)
    if task == "count_shapes":
        return lambda rng: _count_shapes(rng, image_size)
    if task == "multi_image":
        return lambda rng: _multi_image(rng, image_size)
    if task == "dominant_color":
        return lambda rng: _dominant_color(rng, image_size)
    if task == "fading":
        return lambda rng: _fading(rng, image_size)
    if task == "moving_bar":
        return lambda rng: _moving_bar(rng, image_size, difficulty)
    if task == "mixed_media":
        makers = (
            lambda rng: _arithmetic(rng, difficulty),
            lambda rng: _dominant_color(rng, image_size),
            lambda rng: _moving_bar(rng, image_size, 1),
        )
        return lambda rng: rng.choice(makers)(rng)
    if task == "mixed":
        return lambda rng: (
            _arithmetic(rng, difficulty) if rng.random() < 0.5 else _count_shapes(rng, image_size)
        )
    raise ValueError(f"unknown synthetic task {task!r}; valid tasks: {', '.join(TASKS)}")


def make_rows(
    task: str, n_train: int, n_test: int, seed: int = 0, difficulty: int = 1, image_size: int = 56
) -> dict[str, list[Row]]:
    """Generate both splits; each split has its own random stream, and no row repeats anywhere."""
    make = _generator(task, difficulty, image_size)
    space = _problem_space(task, difficulty)
    if space is not None and n_train + n_test > space:
        raise ValueError(
            f"{task} with difficulty={difficulty} has only {space} distinct "
            f"problems, fewer than n_train + n_test = {n_train + n_test}; raise the difficulty"
        )
    seen: set[tuple] = set()
    splits: dict[str, list[Row]] = {}
    for split, n in (("test", n_test), ("train", n_train)):
        rng = random.Random(f"{task}:{seed}:{split}")
        rows: list[Row] = []
        while len(rows) < n:
            row = make(rng)
            if row.key not in seen:
                seen.add(row.key)
                rows.append(row)
        splits[split] = rows
    return {split: splits[split] for split in SPLITS}


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


_MEDIA_TYPE = pa.list_(pa.struct([pa.field("bytes", pa.binary())]))


def _write_parquet(rows: list[Row], path: Path, media: tuple[str, ...]) -> None:
    columns: dict[str, list] = {"problem": [r.problem for r in rows], "answer": [r.answer for r in rows]}
    fields = [pa.field("problem", pa.string()), pa.field("answer", pa.string())]
    if any(r.guess is not None for r in rows):
        columns["guess"] = [r.guess for r in rows]
        fields.append(pa.field("guess", pa.string()))
    if "images" in media:
        columns["images"] = [[{"bytes": _png(image)} for image in r.images] for r in rows]
        fields.append(pa.field("images", _MEDIA_TYPE))
    if "videos" in media:
        columns["videos"] = [[{"bytes": encode_video(list(v), VIDEO_FPS)} for v in r.videos] for r in rows]
        fields.append(pa.field("videos", _MEDIA_TYPE))
    pq.write_table(pa.Table.from_pydict(columns, schema=pa.schema(fields)), path)


def _write_jsonl(rows: list[Row], path: Path, split: str, media: tuple[str, ...]) -> None:
    root = path.parent / IMAGE_DIR
    with path.open("w", encoding="utf-8") as file:
        for index, row in enumerate(rows):
            record = {"problem": row.problem, "answer": row.answer}
            if row.guess is not None:
                record["guess"] = row.guess
            if "images" in media:
                names = [f"{split}/{index:06d}_{k}.png" for k in range(len(row.images))]
                for name, image in zip(names, row.images, strict=True):
                    (root / name).parent.mkdir(parents=True, exist_ok=True)
                    image.save(root / name, format="PNG")
                record["images"] = names
            if "videos" in media:
                names = [f"{split}/{index:06d}_v{k}.mp4" for k in range(len(row.videos))]
                for name, frames in zip(names, row.videos, strict=True):
                    (root / name).parent.mkdir(parents=True, exist_ok=True)
                    (root / name).write_bytes(encode_video(list(frames), VIDEO_FPS))
                record["videos"] = names
            file.write(json.dumps(record, ensure_ascii=False) + "\n")


def _media(task: str) -> tuple[str, ...]:
    """The media columns a task's files have (every row has them, empty where a row has none)."""
    images = () if task in ("arithmetic", "compare", "moving_bar", "fading") else ("images",)
    videos = ("videos",) if task in VIDEO_TASKS else ()
    return images + videos


def write_task(
    task: str,
    out_dir: Path,
    n_train: int,
    n_test: int,
    seed: int = 0,
    fmt: str = "parquet",
    difficulty: int = 1,
    image_size: int = 56,
) -> dict[str, Path]:
    """Write ``out_dir/train.<fmt>`` and ``out_dir/test.<fmt>``; returns split -> file.

    ``fmt="jsonl"`` writes images as PNG and videos as mp4 files under ``out_dir/images`` and
    stores their relative paths, so loading needs ``data.image_dir=out_dir/images``.
    """
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"unknown format {fmt!r}; valid formats: parquet, jsonl")
    splits = make_rows(task, n_train, n_test, seed, difficulty, image_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    media = _media(task)
    files: dict[str, Path] = {}
    for split, rows in splits.items():
        path = out_dir / f"{split}.{fmt}"
        if fmt == "parquet":
            _write_parquet(rows, path, media)
        else:
            _write_jsonl(rows, path, split, media)
        files[split] = path
    return files
