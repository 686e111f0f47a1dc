"""No silent keys: every key of the schema is read by the engine, or handled by one of the tables
of ``easyr1/config_checks.py`` (refused, warned about, or accepted as unable to change results), whose
entries the checks exercise here; and the keys that act through this issue do what EasyR1 does."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import easyr1
from easyr1.cli import main
from easyr1.config import ConfigError, PPOConfig
from easyr1.config_checks import (
    EQUIVALENT,
    RAY_RANK,
    REFUSED,
    WARNED,
    check_config,
    config_warnings,
    planned_world,
    ray_starts_ranks,
)
from easyr1.launch.ray import launch_ray
from easyr1.models.loading import load_model, load_value_model
from easyr1.rewards.worker import RewardWorker
from tests.trainer_utils import run_train, tiny_config

ENGINE = Path(easyr1.__file__).parent


def schema_keys(cls: type = PPOConfig, prefix: str = "") -> Iterator[str]:
    """The dotted name of every leaf of the schema."""
    for name, tp in typing.get_type_hints(cls).items():
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from schema_keys(tp, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def engine_reads() -> set[str]:
    """Names the engine reads outside the config modules: attributes loaded (``cfg.name``) and string
    constants (``getattr(cfg, "name")``). By leaf name, so a leaf that several sections share (the
    three ``fsdp`` sections) counts as read when one is; they go through the same code."""
    names: set[str] = set()
    for path in ENGINE.rglob("*.py"):
        if path.name == "config.py" or path.name.startswith("config_"):  # the schema, its checks and docs
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    return names


def value_of(config: PPOConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def set_key(config: PPOConfig, dotted: str, value: Any) -> PPOConfig:
    *parents, leaf = dotted.split(".")
    setattr(value_of(config, ".".join(parents)) if parents else config, leaf, value)
    return config


def other_value(default: Any) -> Any:
    """A value other than ``default``, of its type."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1
    if default is None:  # the optional strings
        return "other"
    raise AssertionError(f"no other value for {default!r}")


def shown(value: Any) -> str:
    """A value as the command line takes it, and as the messages write it."""
    return value if isinstance(value, str) else json.dumps(value)


HANDLED = {**REFUSED, **WARNED, **EQUIVALENT}


def test_every_key_is_read_or_handled() -> None:
    reads = engine_reads()
    silent = [key for key in schema_keys() if key.rsplit(".", 1)[-1] not in reads and key not in HANDLED]
    assert not silent, (
        f"keys parsed and then ignored: {silent}; read them, or list them in a table of easyr1/config_checks.py"
    )


def test_tables_name_schema_keys_once_with_a_reason() -> None:
    keys = set(schema_keys())
    assert set(HANDLED) <= keys, set(HANDLED) - keys
    assert len(HANDLED) == len(REFUSED) + len(WARNED) + len(EQUIVALENT)  # no key in two tables
    assert all(len(why) > 20 for why in HANDLED.values())


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_a_refused_key_is_an_error_naming_it(key: str, capsys: pytest.CaptureFixture[str]) -> None:
    value = other_value(value_of(PPOConfig(), key))
    with pytest.raises(ConfigError, match=re.escape(f"{key}={shown(value)}: ")):
        check_config(set_key(PPOConfig(), key, value), world=1)
    check_config(PPOConfig(), world=1)
    assert main(["config", f"{key}={shown(value)}"]) == 2
    assert f"{key}={shown(value)}: " in capsys.readouterr().err


@pytest.mark.parametrize("key", sorted(WARNED))
def test_a_warned_key_warns_when_set(key: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert not [m for m in config_warnings(PPOConfig()) if m.startswith(key)]
    value = other_value(value_of(PPOConfig(), key))
    [message] = [m for m in config_warnings(set_key(PPOConfig(), key, value)) if m.startswith(key)]
    assert message.startswith(f"{key}={shown(value)}: ")
    assert main(["config", f"{key}={shown(value)}"]) == 0
    assert f"easyr1 config: warning: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("key", sorted(EQUIVALENT))
def test_an_equivalent_key_takes_any_value_quietly(key: str) -> None:
    config = set_key(PPOConfig(), key, other_value(value_of(PPOConfig(), key)))
    check_config(config, world=1)
    assert config_warnings(config) == []


# ---- easyr1 config runs the checks of easyr1 train --------------------------------------------


def test_easyr1_config_checks_for_the_ranks_the_run_will_have(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["config", "trainer.nnodes=1", "trainer.n_gpus_per_node=3"]) == 2
    assert "data.rollout_batch_size=512 must be divisible by the 3 ranks" in capsys.readouterr().err
    assert main(["config", "trainer.nnodes=2", "trainer.n_gpus_per_node=4", "data.rollout_batch_size=8"]) == 2
    assert (
        "worker.actor.global_batch_size=256 must divide data.rollout_batch_size=8" in capsys.readouterr().err
    )
    assert planned_world(PPOConfig()) == 8
    # easyr1 train checks before it starts a rank: one message, and no rank to stop.
    assert main(["train", "trainer.n_gpus_per_node=2", "data.rollout_batch_size=3"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("data.rollout_batch_size=3 must be divisible by the 2 ranks") == 1 and "exited" not in err
    )
    monkeypatch.setenv("WORLD_SIZE", "2")  # a rank started by torchrun or srun: the ranks it has
    assert planned_world(PPOConfig()) == 2


# ---- trainer.ray_timeline ---------------------------------------------------------------------


def test_ray_timeline_warns_unless_ray_starts_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", RAY_RANK):
        monkeypatch.delenv(name, raising=False)
    config = PPOConfig()
    config.trainer.ray_timeline = "timeline.json"
    [message] = config_warnings(config)
    assert message.startswith("trainer.ray_timeline=timeline.json: ") and "none is written" in message
    config.trainer.nnodes = 2  # easyr1 train hands it to Ray
    assert ray_starts_ranks(config) and config_warnings(config) == []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # a rank of torchrun or srun: no Ray
    assert not ray_starts_ranks(config) and len(config_warnings(config)) == 1
    monkeypatch.setenv(RAY_RANK, "1")  # a rank the Ray launcher started
    assert ray_starts_ranks(config) and config_warnings(config) == []


def test_the_ray_launcher_writes_the_timeline_when_the_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even when a rank fails (here at once, on a refused key): a failed run is when a trace helps."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "local")  # a Ray instance of this test's own
    # Without a token: a new local instance would write ~/.ray/auth_token, which later `ray start` clusters use.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    config = PPOConfig()
    config.trainer.nnodes, config.trainer.n_gpus_per_node = 2, 1
    config.trainer.ray_timeline = str(tmp_path / "trace" / "timeline.json")
    assert launch_ray(config, ["worker.hybrid_engine=false"]) == 2
    events = json.loads(Path(config.trainer.ray_timeline).read_text())
    assert any(event.get("name") == "run" for event in events)  # the ranks' calls of RankProcess.run


# ---- worker.reward.num_cpus -------------------------------------------------------------------


def test_reward_worker_runs_on_num_cpus_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as torchrun sets it for the ranks
    path = tmp_path / "threads.py"
    path.write_text(
        "import os\nREWARD_TYPE = 'batch'\n"
        "def main(inputs):\n    return [{'overall': float(os.environ['OMP_NUM_THREADS'])} for _ in inputs]\n"
    )
    item = {"response": "a", "response_length": 1, "ground_truth": "a"}
    for num_cpus, threads in ((3, 3), (1, 1), (0, 1)):  # 0 CPUs: one thread, as Ray gives
        worker = RewardWorker(str(path), None, timeout=60, num_cpus=num_cpus)
        assert worker([item]) == [{"overall": float(threads)}]
        worker.close()
    assert main(["config", "worker.reward.num_cpus=-1"]) == 2


# ---- model.override_config --------------------------------------------------------------------


def test_override_config_reaches_the_models(tiny_model: Callable[[str], Path]) -> None:
    path = tiny_model("qwen2")
    actor = load_model(path, override_config={"attention_dropout": 0.25})
    assert actor.config.attention_dropout == 0.25
    assert actor.model.layers[0].self_attn.attention_dropout == 0.25  # the modules were built with it
    assert (
        load_model(path, weights=False, override_config={"attention_dropout": 0.25}).config.attention_dropout
        == 0.25
    )
    critic = load_value_model(path, override_config={"attention_dropout": 0.5})
    assert (critic.config.attention_dropout, critic.config.num_labels, critic.config.classifier_dropout) == (
        0.5,
        1,
        0.0,
    )
    assert load_model(path).config.attention_dropout == 0.0  # the folder's own value otherwise


def test_an_override_the_config_lacks_is_an_error_naming_it(tiny_model: Callable[[str], Path]) -> None:
    with pytest.raises(
        ConfigError, match=r"override_config\.no_such_setting: Qwen2Config of .* has no such setting"
    ):
        load_model(tiny_model("qwen2"), override_config={"no_such_setting": 1})
    with pytest.raises(ConfigError, match=r"override_config\.attention_dropout: .* its text_config has it"):
        load_model(tiny_model("qwen2_5_vl"), override_config={"attention_dropout": 0.0})
    with pytest.raises(ConfigError, match=r"override_config\.num_labels: the critic's value head is fixed"):
        load_value_model(tiny_model("qwen2"), override_config={"num_labels": 2})


def test_the_trainer_warns_once_and_loads_with_the_override(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    config = tiny_config(tiny_model("qwen2"), arithmetic, tmp_path / "run")
    bad = "worker.actor.model.override_config={no_such_setting: 1}"
    done = run_train(config, tmp_path, bad, "worker.ref.offload.offload_optimizer=true", timeout=300)
    assert done.returncode == 2
    assert "config error: override_config.no_such_setting: Qwen2Config" in done.stderr, done.stderr[-2000:]
    assert (
        done.stderr.count("worker.ref.offload.offload_optimizer=true: the reference has no optimizer") == 1
    )  # rank 0's, before the models load
