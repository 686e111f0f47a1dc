"""EasyR1-format prompt datasets: files or hub names in, templated and tokenized prompts out.

Sources (``data_path``, optionally ``path@split``):
- a parquet / json / jsonl file. A file holds one split, so ``@split`` is ignored, unless the
  file's name names a different split (``test.parquet@train``), which is an error;
- a folder: ``folder@split`` takes the files whose name is ``split`` or starts with
  ``split-`` / ``split_`` (``train.parquet``, ``train-00000-of-00002.parquet``) or that lie in
  a subfolder named ``split``; a plain ``folder`` means ``folder@train``, as in EasyR1; when no
  file names any split at all, the whole folder is the train split (as in ``datasets``);
- anything else is a hub dataset name, passed to ``datasets.load_dataset`` (needs a network).
Files are loaded with ``datasets`` (memory-mapped Arrow), one at a time so that error
messages can name the file and the row within it.

Rows: ``config.prompt_key`` holds the problem, ``config.answer_key`` the ground truth, handed to
the reward as stored (a number, a list, a dict: the built-in rewards read it as text; a null or NaN
answer is an error), ``config.image_key`` an optional list of images and
``config.video_key`` an optional list of videos (see ``videos.py``: sampled at
``config.video_fps``, at most ``config.video_max_frames`` frames, each frame within
``min_pixels``/``max_pixels``). ``format_prompt`` is a Jinja template rendered in jinja2's
sandbox. Every ``<image>`` in the prompt (after ``format_prompt``) marks where one image goes and
every ``<video>`` where one video goes; the number of placeholders must equal the number of
images (videos), so a row with images and no placeholder is an error, as is a placeholder
without an image. A row may hold images, videos, both, or neither.

Length: the prompt length counts the image and video tokens the processor expands. With
``filter_overlong_prompts`` longer rows are dropped (counted in the log and in ``filtered``); without it,
fetching such a row is an error: truncating would cut the problem or split an image's tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import jinja2
import jinja2.sandbox
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from easyr1.data.images import ImageError, prepare_image
from easyr1.data.paths import FORMATS, names_a_local_path, split_path
from easyr1.data.videos import Video, VideoError, load_video

logger = logging.getLogger(__name__)

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
_PLACEHOLDERS = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")
_SPLIT_NAMES = ("train", "test", "validation", "valid", "val", "dev", "eval")
# Token-aligned processor outputs: the rollout rebuilds them after padding, so they are not kept.
_TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
_ROWS_PER_FILTER_WORKER = 256


class DatasetError(ValueError):
    """A problem with a dataset; the message names the file and, where it applies, the row."""


# ------------------------------------------------------------------------------------ sources


@dataclass(frozen=True)
class _Source:
    """One loaded file (or hub split) and where its rows start in the concatenated dataset."""

    name: str
    start: int


def _names_split(path: Path, split: str, root: Path) -> bool:
    stem = path.name.split(".", 1)[0]
    in_folder = split in path.relative_to(root).parts[:-1]
    return in_folder or stem == split or re.match(rf"{re.escape(split)}[-_]", stem) is not None


def split_files(folder: Path, split: str | None) -> list[Path]:
    """The data files of ``split`` in ``folder`` (sorted); see the module docstring for the rules."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix in FORMATS
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if not files:
        raise DatasetError(f"{folder}: no .parquet, .json or .jsonl files in this folder")
    split = split or "train"
    chosen = [p for p in files if _names_split(p, split, folder)]
    if (
        not chosen
        and split == "train"
        and not any(_names_split(p, s, folder) for p in files for s in _SPLIT_NAMES)
    ):
        chosen = files
    if not chosen:
        listed = ", ".join(str(p.relative_to(folder)) for p in files)
        raise DatasetError(f"{folder}@{split}: no file of split {split!r} in this folder (files: {listed})")
    return chosen


def _file_format(files: list[Path], where: str) -> str:
    kinds = {FORMATS.get(p.suffix) for p in files}
    if None in kinds:
        raise DatasetError(f"{where}: unsupported file type (use .parquet, .json or .jsonl)")
    if len(kinds) > 1:
        raise DatasetError(f"{where}: mixes parquet and json files; keep one format per split")
    return kinds.pop()


def _has_no_rows(file: Path) -> bool:
    if file.stat().st_size == 0:
        return True
    return file.suffix == ".parquet" and pq.ParquetFile(file).metadata.num_rows == 0


def _json_rows(file: Path) -> Iterator[tuple[int, int, Any]]:
    """(row, line, record) of each record of a .jsonl file (one a line) or a .json file (an array;
    line 0); a line that is not JSON is a DatasetError naming it."""
    text = file.read_text(encoding="utf-8")
    if file.suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{file}: line {exc.lineno}: not JSON: {exc.msg}") from exc
        yield from ((row, 0, record) for row, record in enumerate(records))
        return
    row = 0
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():  # `datasets` skips blank lines too
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{file}: line {line}: not JSON: {exc.msg} (column {exc.colno})") from exc
        yield row, line, record
        row += 1


def _check_json(file: Path) -> None:
    """A DatasetError for the first line of a JSON file that is not JSON, or the first key whose rows
    mix text with other values (numbers, lists; null is a missing value): `datasets` refuses such a
    key (4.0) or reads it back altered (later: the text "0.50" decoded as the number 0.5)."""
    text_at: dict[str, str] = {}
    other_at: dict[str, tuple[str, str]] = {}
    for row, line, record in _json_rows(file):
        where = f"row {row}" + (f", line {line}" if line else "")
        for key, value in record.items() if isinstance(record, dict) else ():
            if isinstance(value, str):
                text_at.setdefault(key, where)
            elif value is not None:
                other_at.setdefault(key, (where, type(value).__name__))
            if key in text_at and key in other_at:
                other, kind = other_at[key]
                raise DatasetError(
                    f"{file}: {key!r} mixes text ({text_at[key]}) with a {kind} ({other}), which `datasets` "
                    f'cannot read as written (the text "0.50" would become the number 0.5): make every '
                    f"row's {key!r} text (numbers quoted), or none"
                )


def load_source(data_path: str) -> tuple[datasets.Dataset, list[_Source]]:
    """Load a file, folder or hub dataset (see the module docstring) and where each file's rows start."""
    path_str, split = split_path(data_path)
    path = Path(path_str).expanduser()
    if path.is_dir():
        files = split_files(path, split)
    elif path.is_file():
        other = [s for s in _SPLIT_NAMES if s != split and _names_split(path, s, path.parent)]
        if split is not None and other and not _names_split(path, split, path.parent):
            raise DatasetError(f"{data_path}: the file {path.name} is the {other[0]!r} split, not {split!r}")
        files = [path]
    elif names_a_local_path(path_str):
        raise DatasetError(f"{data_path}: no such file or folder")
    else:
        return _load_hub(path_str, split or "train")
    kind = _file_format(files, data_path)
    parts, sources, start = [], [], 0
    for file in files:
        try:
            if _has_no_rows(file):  # `datasets` fails on these instead of returning zero rows
                continue
            part = datasets.load_dataset(kind, data_files=str(file), split="train")
        except Exception as exc:  # parse errors come in many types; the cause stays chained
            if kind == "json":  # `datasets` says a byte offset or a column: name the line and the rows
                _check_json(file)
            raise DatasetError(f"{file}: cannot be read as {kind}: {exc.__cause__ or exc!r}") from exc
        if kind == "json" and any(type(feature).__name__ == "Json" for feature in part.features.values()):
            _check_json(file)  # `datasets` 4.1 and later read a key of mixed types, decoding its text as JSON
        parts.append(part)
        sources.append(_Source(str(file), start))
        start += len(part)
    if not parts:
        raise DatasetError(f"{data_path}: the dataset is empty")
    try:
        data = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    except ValueError as exc:
        raise DatasetError(f"{data_path}: its files have different columns or types: {exc}") from exc
    return data, sources


def _load_hub(name: str, split: str) -> tuple[datasets.Dataset, list[_Source]]:
    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as exc:  # datasets raises many types; the cause stays chained
        raise DatasetError(
            f"{name}@{split}: not a local file or folder, and loading it from the hub failed: {exc}"
        ) from exc
    return data, [_Source(f"{name}@{split}", 0)]


# ------------------------------------------------------------------------------------ dataset


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read {what} {path!r}: {exc}") from exc


def _prompt_template(path: str) -> jinja2.Template:
    """``data.format_prompt``, compiled in jinja2's immutable sandbox: a template is data, so it
    may fill in ``content`` but not reach Python objects (``cycler.__init__.__globals__.os``)."""
    try:
        # StrictUndefined: a misspelt name ({{ contnt }}) is an error, not an empty string in every prompt.
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined)
        return environment.from_string(_read_text(path, "format_prompt"))
    except jinja2.TemplateSyntaxError as exc:
        raise DatasetError(f"data.format_prompt {path}: line {exc.lineno}: {exc.message}") from exc


class RLDataset(Dataset):
    """Prompts of an EasyR1-format dataset, templated and tokenized (image and video tokens expanded)."""

    def __init__(self, data_path: str, tokenizer: Any, processor: Any, config: Any) -> None:
        self.tokenizer, self.processor, self.config = tokenizer, processor, config
        self.data_path = data_path
        self.data, self._sources = load_source(data_path)
        self._check_columns()
        self._check_answers()
        self._format = _prompt_template(config.format_prompt) if config.format_prompt else None
        self._chat_template = self._pick_chat_template()
        rows = list(range(len(self.data)))
        if not rows:
            raise DatasetError(f"{data_path}: the dataset is empty")
        if config.filter_overlong_prompts:
            rows = self._filter_overlong(rows)
        self._rows = rows
        self.filtered = len(self.data) - len(
            rows
        )  # overlong prompts dropped: the data/filtered_prompts metric

    # -- setup checks

    def _where(self, row: int) -> str:
        source = max((s for s in self._sources if s.start <= row), key=lambda s: s.start)
        return f"{source.name} row {row - source.start}"

    def _check_columns(self) -> None:
        columns = self.data.column_names
        for key in (self.config.prompt_key, self.config.answer_key):
            if key not in columns:
                names = ", ".join(s.name for s in self._sources)
                raise DatasetError(f"{names}: no column {key!r} (columns: {', '.join(columns)})")

    def _check_answers(self) -> None:
        """Fail on the first row without an answer: ``str(None)`` is "None" and ``str(nan)`` is "nan",
        answers a reward would match (the math reward scores ``\\boxed{None}`` as correct)."""
        column = self.data.data.column(self.config.answer_key)
        missing = pc.is_null(column, nan_is_null=pa.types.is_floating(column.type))
        rows = pc.indices_nonzero(pa.chunked_array(missing).combine_chunks())
        if len(rows):
            raise DatasetError(
                f"{self._where(rows[0].as_py())}: answer {self.config.answer_key!r} is missing (null or NaN); "
                f"every row needs a ground truth"
            )

    def _pick_chat_template(self) -> str:
        if self.config.override_chat_template:
            return _read_text(self.config.override_chat_template, "override_chat_template")
        template = getattr(self.processor, "chat_template", None) or self.tokenizer.chat_template
        if not template:
            raise DatasetError("the tokenizer has no chat template; set data.override_chat_template")
        return template

    def most_media(self) -> tuple[int, int]:
        """The most images and the most videos one prompt holds (what ``worker.rollout.limit_images``
        and ``limit_videos`` of 0 stand for), read from the columns without decoding a row."""
        return self._most(self.config.image_key), self._most(self.config.video_key)

    def _most(self, key: str) -> int:
        if key not in self.data.column_names:
            return 0
        column = self.data.data.column(key)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            return int(pc.max(pc.list_value_length(column)).as_py() or 0)
        return int(column.null_count < len(column))  # one item a row (a path, a bytes dict), or none

    # -- filtering

    def _filter_overlong(self, rows: list[int]) -> list[int]:
        lengths = self._prompt_lengths(rows)
        limit = self.config.max_prompt_length
        kept = [row for row, length in zip(rows, lengths, strict=True) if length <= limit]
        if len(kept) < len(rows):
            logger.info(
                "%s: dropped %d of %d prompts longer than max_prompt_length=%d",
                self.data_path,
                len(rows) - len(kept),
                len(rows),
                limit,
            )
        if not kept:
            raise DatasetError(
                f"{self.data_path}: empty after filtering: all {len(rows)} prompts are longer than "
                f"max_prompt_length={limit} (the shortest has {min(lengths)} tokens)"
            )
        return kept

    def _prompt_lengths(self, rows: list[int]) -> list[int]:
        """Prompt lengths of ``rows``; large datasets use forked workers (no pickling of self)."""
        workers = min(
            self.config.filter_overlong_prompts_workers,
            os.cpu_count() or 1,
            len(rows) // _ROWS_PER_FILTER_WORKER,
        )
        if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
            return [self.prompt_length(row) for row in rows]
        global _FORKED
        _FORKED = self
        try:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                return pool.map(_length_in_worker, rows, chunksize=math.ceil(len(rows) / (4 * workers)))
        finally:
            _FORKED = None

    def prompt_length(self, row: int) -> int:
        """Tokens of row ``row``'s templated prompt, image and video tokens included."""
        return len(self._encode(row)["input_ids"])

    # -- encoding

    def _message_content(self, text: str) -> str | list[dict[str, str]]:
        """The user message: plain text, or parts with an image or video part at each placeholder."""
        pieces = _PLACEHOLDERS.split(text)
        if len(pieces) == 1:
            return text
        kinds = {IMAGE_PLACEHOLDER: "image", VIDEO_PLACEHOLDER: "video"}
        return [
            {"type": kinds[piece]} if piece in kinds else {"type": "text", "text": piece}
            for piece in pieces
            if piece
        ]

    def _media(self, record: dict[str, Any], key: str, text: str, placeholder: str, row: int) -> list[Any]:
        """The row's entries of column ``key``, one per ``placeholder`` in the prompt."""
        items = record.get(key) or []
        if isinstance(items, (dict, str, bytes)):
            items = [items]
        what = "image" if placeholder == IMAGE_PLACEHOLDER else "video"
        if text.count(placeholder) != len(items):
            raise DatasetError(
                f"{self._where(row)}: {len(items)} {what}(s) but {text.count(placeholder)} {placeholder} "
                f"placeholder(s) in the prompt; each {what} needs one {placeholder} where it goes"
            )
        if items and self.processor is None:
            raise DatasetError(f"{self._where(row)}: has {what}s, but the model is text-only (no processor)")
        return list(items)

    def _encode(self, row: int) -> dict[str, Any]:
        record = self.data[row]
        text = record[self.config.prompt_key]
        if not isinstance(text, str):
            raise DatasetError(
                f"{self._where(row)}: prompt {self.config.prompt_key!r} is not a string: {text!r}"
            )
        if self._format is not None:
            text = self._render_format(text, row)
        config = self.config
        images = []
        for i, item in enumerate(self._media(record, config.image_key, text, IMAGE_PLACEHOLDER, row)):
            try:
                images.append(prepare_image(item, config.image_dir, config.min_pixels, config.max_pixels))
            except ImageError as exc:
                raise DatasetError(f"{self._where(row)}: image {i}: {exc}") from exc
        videos: list[Video] = []
        for i, item in enumerate(self._media(record, config.video_key, text, VIDEO_PLACEHOLDER, row)):
            try:
                videos.append(
                    load_video(
                        item,
                        config.image_dir,
                        config.video_fps,
                        config.video_max_frames,
                        config.min_pixels,
                        config.max_pixels,
                    )
                )
            except VideoError as exc:
                raise DatasetError(f"{self._where(row)}: video {i}: {exc}") from exc
        messages = [{"role": "user", "content": self._message_content(text)}]
        prompt = self.tokenizer.apply_chat_template(
            messages, chat_template=self._chat_template, tokenize=False, add_generation_prompt=True
        )
        if images or videos:
            media: dict[str, Any] = {"images": images} if images else {}
            if videos:
                media.update(videos=[v.frames for v in videos], video_metadata=[v.metadata() for v in videos])
            encoded = self.processor(text=[prompt], add_special_tokens=False, return_tensors="pt", **media)
            multi_modal = {k: v for k, v in encoded.items() if k not in _TOKEN_KEYS}
        else:
            encoded = self.tokenizer([prompt], add_special_tokens=False, return_tensors="pt")
            multi_modal = {}
        return {
            "input_ids": encoded["input_ids"][0].long(),
            "prompt": prompt,
            "images": images,
            "videos": videos,
            "multi_modal_inputs": multi_modal,
            "ground_truth": record[self.config.answer_key],  # as stored (a list, a dict), as EasyR1 passes it
            "index": row,
        }

    def _render_format(self, text: str, row: int) -> str:
        try:
            return self._format.render(content=text)
        except (
            Exception
        ) as exc:  # the template's own errors (1/0, a filter on the wrong type) as well as jinja2's
            raise DatasetError(
                f"{self._where(row)}: data.format_prompt {self.config.format_prompt}: {type(exc).__name__}: {exc}"
            ) from exc

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint records of the training data, for resuming to tell whether it changed in
        place: the row count and a SHA-256 of every row's prompt and answer, in order (rows reordered,
        answers replaced, a prompt edited: each changes it). The text as loaded, not the files' bytes or
        times, so a copy of the data elsewhere is the same data; text only, as reading every image
        and video again at each start would not be cheap: an image replaced in place is not seen."""
        digest = hashlib.sha256()
        for key in (self.config.prompt_key, self.config.answer_key):
            for value in self.data.data.column(key).to_pylist():
                text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
                encoded = text.encode()
                digest.update(len(encoded).to_bytes(8, "little") + encoded)
        return {"rows": len(self.data), "sha256": digest.hexdigest()}

    # -- torch Dataset

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self._rows[i]
        item = self._encode(row)
        length, limit = len(item["input_ids"]), self.config.max_prompt_length
        if length > limit:
            raise DatasetError(
                f"{self._where(row)}: the prompt has {length} tokens, more than max_prompt_length={limit}; "
                f"set data.filter_overlong_prompts=true to drop such rows, or raise data.max_prompt_length"
            )
        return item


_FORKED: RLDataset | None = None


def _length_in_worker(row: int) -> int:
    assert _FORKED is not None
    return _FORKED.prompt_length(row)


# ------------------------------------------------------------------------------------ loading


def collate_fn(batch: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Batch of items -> dict of lists, unpadded: the rollout pads to its own layout."""
    return {key: [item[key] for item in batch] for key in batch[0]}


class ResumableBatchSampler(Sampler[list[int]]):
    """Seeded batches whose position survives a checkpoint.

    The order of epoch ``e`` depends only on ``seed + e``, so a resumed run sees exactly the
    batches an uninterrupted one would. ``ResumableDataLoader`` advances ``batch`` as batches
    are consumed (not as workers prefetch them).
    """

    def __init__(self, size: int, batch_size: int, shuffle: bool, seed: int, drop_last: bool) -> None:
        if size == 0:
            raise DatasetError("cannot batch an empty dataset")
        self.size, self.shuffle, self.seed, self.drop_last = size, shuffle, seed, drop_last
        self.batch_size = size if batch_size <= 0 else batch_size
        if drop_last and self.batch_size > size:
            raise DatasetError(
                f"batch size {self.batch_size} exceeds the dataset's {size} rows with drop_last"
            )
        self.epoch, self.batch = 0, 0

    def batches(self, epoch: int) -> list[list[int]]:
        if self.shuffle:
            order = torch.randperm(
                self.size, generator=torch.Generator().manual_seed(self.seed + epoch)
            ).tolist()
        else:
            order = list(range(self.size))
        stop = self.size - self.size % self.batch_size if self.drop_last else self.size
        return [order[i : i + self.batch_size] for i in range(0, stop, self.batch_size)]

    def __len__(self) -> int:
        return self.size // self.batch_size if self.drop_last else math.ceil(self.size / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches(self.epoch)[self.batch :])

    def endless(self) -> Iterator[list[int]]:
        """Batches from the position on, epoch after epoch without end; the position moves past each
        batch as it is taken, so a checkpoint saved after a step resumes with the next one."""
        while True:
            batches = self.batches(self.epoch)
            while self.batch < len(batches):
                rows = batches[self.batch]
                self.batch += 1
                yield rows
            self.epoch, self.batch = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch, "size": self.size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume the position; refused when the rows it counts changed in number (data added or
        removed, or other prompts filtered as overlong): the epoch's order would be another, and rows
        would be seen twice or never. (Positions saved before the size was kept are taken as they are.)"""
        if "size" in state and int(state["size"]) != self.size:
            raise DatasetError(
                f"the checkpoint's position in the training data counts {state['size']} rows; data.train_files "
                f"now gives {self.size}, so the position would name other rows. Restore the data as it was, or "
                "start over: trainer.find_last_checkpoint=false, or another trainer.save_checkpoint_path"
            )
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


class ResumableDataLoader(DataLoader):
    """A DataLoader whose ``state_dict`` records the batches consumed; iterating resumes from there."""

    batch_sampler: ResumableBatchSampler

    def __iter__(self) -> Iterator[dict[str, list[Any]]]:
        sampler = self.batch_sampler
        for batch in super().__iter__():
            sampler.batch += 1
            yield batch
        sampler.epoch, sampler.batch = sampler.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batch_sampler.load_state_dict(state)


def make_dataloader(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    num_workers: int = 0,
) -> ResumableDataLoader:
    """A resumable loader over ``dataset``; ``batch_size <= 0`` means one batch of everything."""
    sampler = ResumableBatchSampler(len(dataset), batch_size, shuffle, seed, drop_last)
    return ResumableDataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=num_workers)
