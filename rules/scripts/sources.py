"""Where a matrix's models and data sets come from: built tiny models, synthetic data sets and warm
starts (folders under runs/prepared/ whose names carry what defines them), or paths and hub names
given in the matrix, checked before any job where they can only be local."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from easyr1.config import ConfigError
from easyr1.data.paths import names_a_local_path, split_path
from rules.scripts.inputs import check_columns
from rules.scripts.matrix import PREPARED, Matrix, merged, nested, repo_file, short_hash

VISION_ARCHS = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}
# Tasks with images or videos: a text-only model is left out of their cells.
IMAGE_TASKS = {
    "count_shapes",
    "multi_image",
    "mixed",
    "dominant_color",
    "moving_bar",
    "fading",
    "mixed_media",
}


def is_vision(config: dict[str, Any], name: str) -> bool:
    model = config["models"][name]
    return model.get("tiny") in VISION_ARCHS or model.get("vision", False)


def has_images(config: dict[str, Any], name: str) -> bool:
    dataset = config["datasets"][name]
    synthetic = dataset.get("synthetic")
    return synthetic["task"] in IMAGE_TASKS if synthetic else dataset["images"]


def data_dir(config: dict[str, Any], name: str) -> str:
    """Where a synthetic data set is written; the name carries everything that defines it."""
    s = config["datasets"][name]["synthetic"]
    return f"{PREPARED}/data/{s['task']}-d{s['difficulty']}-{s['train']}-{s['test']}-s{s['seed']}"


def local_source(matrix: Matrix, key: str, value: str, here: bool) -> str:
    """A data set or model as the engine will load it: a path that can only be local
    (``names_a_local_path``: a data file's name, from /, ~ or ., or of three parts or more) must
    exist, or every cell would fail after preparation. A relative one is read from the working
    directory; an absolute one is checked where the job reading it runs on this machine's files
    (``here``: natively or in a virtualenv, on this machine or on a cluster's shared file system),
    and left to the job in an image, where it may be the image's own or bound from elsewhere."""
    path, _ = split_path(value)
    full = Path(path).expanduser()
    if not names_a_local_path(path) or (full.is_absolute() and not here) or full.exists():
        return value
    where = (
        "a job outside an image reads an absolute path from this machine's files"
        if full.is_absolute()
        else f"local paths are read from the working directory, {Path.cwd()}"
    )
    raise matrix.error(key, f"{value}: no such file or folder ({where})")


def local_columns(matrix: Matrix, key: str, value: str, needed: dict[str, str]) -> None:
    """A local data file's columns must hold ``needed`` (config key -> column): checked from its
    first row (``check_columns``), before any job, where the engine would fail inside every one."""
    path = Path(split_path(value)[0]).expanduser()
    if not path.is_file():
        return
    try:
        check_columns(path, needed)
    except ConfigError as exc:
        raise matrix.error(key, f"{value}: {exc}") from None


def splits(matrix: Matrix, name: str, here: bool = True) -> tuple[str, str]:
    """A data set's (train, test) as the engine loads them (``here``: see ``local_source``)."""
    dataset = matrix.config["datasets"][name]
    if "synthetic" in dataset:
        return f"{data_dir(matrix.config, name)}@train", f"{data_dir(matrix.config, name)}@test"
    train, test = (
        local_source(matrix, f"datasets.{name}.{split}", dataset[split], here) for split in ("train", "test")
    )
    return train, test


def data_view(matrix: Matrix, name: str) -> dict[str, Any]:
    """The engine's data.* keys as the base config and the data set's overrides set them."""
    return merged(
        matrix.base.get("data", {}), nested(matrix.config["datasets"][name]["overrides"]).get("data", {})
    )


def warm_start_spec(matrix: Matrix, name: str) -> dict[str, Any]:
    """Everything that defines a model's warm start; its hash names the folder it is cached in."""
    config = matrix.config
    warm = config["models"][name]["warm_start"]
    dataset_name = warm["dataset"]
    if dataset_name not in config["datasets"]:
        raise matrix.error(f"models.{name}.warm_start.dataset", f"unknown data set {dataset_name!r}")
    if has_images(config, dataset_name) and not is_vision(config, name):
        raise matrix.error(
            f"models.{name}.warm_start.dataset", f"{dataset_name} has images; {name} is text-only"
        )
    dataset = config["datasets"][dataset_name]
    data = data_view(matrix, dataset_name)
    spec = {
        "model": built_model_dir(config, name),
        "data": splits(matrix, dataset_name, matrix.prepare_image is None)[0],
        "answer_format": dataset["answer_format"],
        "prompt_key": data.get("prompt_key", "problem"),
        "answer_key": warm.get("answer_key", data.get("answer_key", "answer")),
        "max_prompt_length": data.get("max_prompt_length", 256),
        "steps": warm["steps"],
        "batch_size": warm["batch_size"],
        "lr": warm["lr"],
    }
    if "synthetic" not in dataset:
        local_columns(
            matrix,
            f"datasets.{dataset_name}.train",
            spec["data"],
            {
                "data.prompt_key": spec["prompt_key"],
                f"models.{name}.warm_start.answer_key": spec["answer_key"],
            }
            if "answer_key" in warm
            else {"data.prompt_key": spec["prompt_key"], "data.answer_key": spec["answer_key"]},
        )
    for bound in ("min_pixels", "max_pixels"):  # the images as the RL run will see them
        if has_images(config, dataset_name) and bound in data:
            spec[bound] = "none" if data[bound] is None else data[bound]
    if "format_prompt" in dataset:
        spec["format_prompt"] = repo_file(
            matrix, f"datasets.{dataset_name}.format_prompt", dataset["format_prompt"]
        )
    return spec


def warm_start_dir(matrix: Matrix, name: str) -> str:
    return f"{PREPARED}/warm/{name}-{short_hash(matrix, warm_start_spec(matrix, name))}"


def built_model_dir(config: dict[str, Any], name: str) -> str:
    """The folder the harness builds a ``tiny`` model in: ``{arch}``, or ``{arch}-{scale}`` for the
    architecture at a real family's size (random-init: what memory and speed are at that size;
    the engine's ``tiny-model --size`` refuses a size it does not know, naming the ones it does)."""
    model = config["models"][name]
    suffix = f"-{model['scale']}" if "scale" in model else ""
    return f"{PREPARED}/model/{model['tiny']}{suffix}"


def model_path(matrix: Matrix, name: str, here: bool = True) -> str:
    """Where a cell finds model ``name`` (``here``: see ``local_source``)."""
    model = matrix.config["models"][name]
    if "path" in model:
        return local_source(matrix, f"models.{name}.path", model["path"], here)
    return warm_start_dir(matrix, name) if "warm_start" in model else built_model_dir(matrix.config, name)


def warm_starts(matrix: Matrix) -> dict[str, dict[str, Any]]:
    """Every warm start the matrix's models ask for: its folder -> its spec."""
    models = matrix.config["models"]
    return {
        warm_start_dir(matrix, m): warm_start_spec(matrix, m) for m in models if "warm_start" in models[m]
    }


def synthetic_sets(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every synthetic data set of the matrix: its folder -> its settings (``easyr1 make-data``'s flags)."""
    datasets = config["datasets"]
    return {data_dir(config, d): datasets[d]["synthetic"] for d in datasets if "synthetic" in datasets[d]}
