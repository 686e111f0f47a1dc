"""The GPU examples in ``examples/*.yaml``, as a user runs them.

Every file passes ``easyr1 config``'s checks as written, names in its header the GPUs it runs on
and every key it changes from ``examples/config.yaml`` (docs/training.md: "each file's header lists
the keys it changes"). The ones that reproduce an EasyR1 example script resolve to what that script gives
(``SCRIPTS`` in tests/training/test_easyr1_examples.py). Each of those has a tiny twin, the same file with
the model swapped for its family's tiny model, the data for offline synthetic data of the same
shape (an image and a number for Geometry3k, two images for the multi-image example, arithmetic for
math12k) and batches and lengths shrunk, which trains 2 steps on 2 CPU ranks. Files whose twins
resolve to the same config share one run (a run costs ~25 s here, nearly all of it start-up).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from itertools import takewhile
from pathlib import Path
from typing import Any

import pytest
import yaml

from easyr1 import cli
from easyr1.config import load_config
from easyr1.memory import GIB, estimate
from easyr1.models.architecture import Architecture
from tests.trainer_utils import read_metrics
from tests.training.test_easyr1_examples import SCRIPTS

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
BASE = REPO / "examples" / "config.yaml"

# A key an example may leave out of its header: the run's name.
UNLISTED = {"trainer.experiment_name"}
# Where a file departs on purpose from the EasyR1 script it reproduces (the file's header says why).
DEPARTURES: dict[str, set[str]] = {
    # EasyR1's lora.exclude_modules defaults to .*visual.*; this engine's to none.
    "qwen3_vl_4b_geo3k_grpo_lora": {"worker.actor.model.lora.exclude_modules"},
}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value; dicts that are values of their own (kwargs, sampling overrides) stay whole."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key not in ("reward_function_kwargs", "val_override_config"):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def resolved(*args: str) -> dict[str, Any]:
    """The config that ``args`` resolve to, flattened (relative paths from the repository root)."""
    return flatten(yaml.safe_load(load_config(list(args)).to_yaml()))


def header(path: Path) -> str:
    """The comment lines the file opens with."""
    return "\n".join(takewhile(lambda line: line.startswith("#"), path.read_text().splitlines()))


# ------------------------------------------------------------------ every file resolves and says what it needs


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_resolves_and_its_header_names_gpus_and_changes(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``easyr1 config`` prints for the file; a header whose GPU count is the config's
    (nnodes x n_gpus_per_node) and which names every key whose value differs from config.yaml's,
    so a reader of the header knows what the run needs and what it changes."""
    monkeypatch.chdir(REPO)
    assert cli.main(["config", f"config={path}"]) == 0, capsys.readouterr().err
    config = yaml.safe_load(capsys.readouterr().out)
    text = header(path)
    gpus = re.search(r"\b(\d+) GPUs?\b", text)
    assert gpus, f"{path.name}: the header names no GPU count"
    assert int(gpus.group(1)) == config["trainer"]["nnodes"] * config["trainer"]["n_gpus_per_node"]
    if path == BASE:
        return
    base, flat = resolved(f"config={BASE}"), flatten(config)
    listed = set(re.findall(r"\b((?:data|algorithm|worker|trainer)\.[\w.]+)=", text))
    changed = {key for key in base.keys() | flat.keys() if base.get(key) != flat.get(key)} - UNLISTED
    assert changed <= listed, f"{path.name}: the header does not list {sorted(changed - listed)}"


# "easyr1 memory --model ARCH:SIZE: X GiB peak per GPU on N x G GB", and optionally "; Y GiB on M x G GB".
MEMORY_CLAIM = re.compile(
    r"easyr1 memory --model (\S+): ([\d.]+) GiB peak per GPU on (\d+) x (\d+) GB(?:;\s+([\d.]+) GiB on (\d+) x (\d+) GB)?"
)
SIZED = [path for path in EXAMPLES if "easyr1 memory --model" in header(path)]


@pytest.mark.parametrize("path", SIZED, ids=lambda p: p.name)
def test_the_headers_memory_figures_are_todays_estimate(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each peak a header quotes is what ``easyr1 memory`` predicts today for the file on that model's
    shapes, so a change to the estimator that moves one must move the header with it."""
    monkeypatch.chdir(REPO)
    text = " ".join(line.lstrip("# ") for line in header(path).splitlines())
    claim = MEMORY_CLAIM.search(text)
    assert claim, f"{path.name}: the header's memory figure is not in the form the test reads"
    arch, config = Architecture.load(claim[1]), load_config([f"config={path}"])
    for gib, gpus, size in [claim.group(2, 3, 4)] + ([claim.group(5, 6, 7)] if claim[5] else []):
        predicted = estimate(config, arch, gpus=int(gpus), gpu_memory_gib=float(size)).device / GIB
        assert f"{predicted:.1f}" == gib, (
            f"{path.name}: {gib} GiB on {gpus} x {size} GB; easyr1 memory says {predicted:.1f}"
        )


# ------------------------------------------------------------------ the EasyR1 examples, reproduced


MIRRORED = [path.stem for path in EXAMPLES if path.stem in SCRIPTS]


def test_easyr1_examples_are_here() -> None:
    """The examples issue 21 asks for exist (the video one is tested with its own file)."""
    assert set(MIRRORED) >= {
        "qwen2_5_vl_7b_geo3k_grpo",
        "qwen2_5_vl_3b_geo3k_grpo",
        "qwen2_5_vl_32b_geo3k_grpo",
        "qwen2_5_vl_7b_multi_image",
        "qwen3_vl_4b_geo3k_grpo",
        "qwen3_vl_4b_geo3k_grpo_lora",
        "qwen3_4b_math_grpo",
        "qwen3_4b_math_grpo_lora",
    }


@pytest.mark.parametrize("name", MIRRORED)
def test_example_is_easyr1_script(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file named like an EasyR1 script resolves to what that script's arguments give on
    config.yaml (with the file's model as the script's MODEL_PATH), so it runs EasyR1's example."""
    monkeypatch.chdir(REPO)
    mine = resolved(f"config=examples/{name}.yaml")
    args = [a.replace("${MODEL_PATH}", mine["worker.actor.model.model_path"]) for a in SCRIPTS[name]]
    theirs = resolved(f"config={BASE}", *args)
    differ = {key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key)}
    assert differ == DEPARTURES.get(name, set())


# ------------------------------------------------------------------ tiny twins train


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory, arithmetic: Path) -> dict[str, Path]:
    """Offline data shaped like each example's: one image and a number (Geometry3k), two images
    (JourneyBench multi-image), arithmetic (math12k)."""
    from easyr1.data.synthetic import write_task

    root = tmp_path_factory.mktemp("example_data")
    write_task("count_shapes", root / "shapes", n_train=16, n_test=4, seed=0, image_size=56)
    write_task("multi_image", root / "pairs", n_train=16, n_test=4, seed=0, image_size=56)
    return {"shapes": root / "shapes", "pairs": root / "pairs", "arithmetic": arithmetic}


# Twin -> (tiny architecture, data, the example files it stands for).
TWINS: dict[str, tuple[str, str, list[str]]] = {
    "qwen2_5_vl_geo3k": ("qwen2_5_vl", "shapes", ["qwen2_5_vl_7b_geo3k_grpo", "qwen2_5_vl_3b_geo3k_grpo"]),
    "qwen2_5_vl_bf16": ("qwen2_5_vl", "shapes", ["qwen2_5_vl_32b_geo3k_grpo"]),
    "qwen2_5_vl_multi_image": ("qwen2_5_vl", "pairs", ["qwen2_5_vl_7b_multi_image"]),
    "qwen3_vl_geo3k": ("qwen3_vl", "shapes", ["qwen3_vl_4b_geo3k_grpo"]),
    "qwen3_vl_lora": ("qwen3_vl", "shapes", ["qwen3_vl_4b_geo3k_grpo_lora"]),
    "qwen3_math": ("qwen3", "arithmetic", ["qwen3_4b_math_grpo"]),
    "qwen3_math_lora": ("qwen3", "arithmetic", ["qwen3_4b_math_grpo_lora"]),
}


def twin_overrides(model: Path, data: Path, run_dir: Path) -> list[str]:
    """The example on 2 CPU ranks for 2 steps: the tiny model and data, small batches and lengths,
    no validation or checkpoints; every other key (precision, LoRA, micro-batches, KL) as the file has it."""
    return [
        f"worker.actor.model.model_path={model}",
        f"data.train_files={data}@train",
        f"data.val_files={data}@test",
        "data.max_prompt_length=512",
        "data.max_response_length=8",
        "data.rollout_batch_size=4",
        "data.val_batch_size=4",
        "worker.actor.global_batch_size=2",
        "worker.rollout.n=2",
        "worker.rollout.tensor_parallel_size=1",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=2",
        "trainer.max_steps=2",
        "trainer.val_before_train=false",
        "trainer.val_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        "trainer.experiment_name=twin",
        f"trainer.save_checkpoint_path={run_dir}",
    ]


def test_twins_cover_every_reproduced_example() -> None:
    """A new EasyR1 example file needs a twin here, or it would go untrained."""
    assert sorted(name for _, _, names in TWINS.values() for name in names) == sorted(MIRRORED)


@pytest.mark.parametrize("twin", TWINS)
def test_tiny_twin_trains(
    twin: str,
    tiny_model: Callable[[str], Path],
    synthetic: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The twin of each example trains 2 steps on 2 CPU ranks with the file's own keys; examples
    that share a twin resolve to the same twin config, so this one run trains each of them."""
    arch, data, names = TWINS[twin]
    overrides = twin_overrides(tiny_model(arch), synthetic[data], tmp_path / "run")
    monkeypatch.chdir(REPO)
    configs = [resolved(f"config=examples/{name}.yaml", *overrides) for name in names]
    assert all(config == configs[0] for config in configs[1:])

    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, "-m", "easyr1.cli", "train", f"config=examples/{names[0]}.yaml", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = read_metrics(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/grad_norm"])
    # The file's LoRA keys reach the engine: its reference is then the actor without adapters.
    lora = configs[0]["worker.actor.model.lora.rank"] > 0
    assert ("reference: the actor with its LoRA adapters off" in done.stdout) == lora
