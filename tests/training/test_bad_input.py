"""Bad input and untrusted files (issue 14): out-of-range numbers, rows without an answer, prompts
lost to the length filter, a missing reward file, prompt templates that try to run code, and
model folders whose own code runs only when ``trust_remote_code`` says so."""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from huggingface_hub import is_offline_mode

from easyr1.cli import main
from easyr1.config import ConfigError, PPOConfig, load_config, read_yaml
from easyr1.data.config import DataConfig
from easyr1.data.dataset import DatasetError, RLDataset
from easyr1.launch.rank import configure_logging
from easyr1.models.loading import load_model, load_tokenizer, load_value_model, read_config
from easyr1.rewards.loader import RewardFunctionError, check_reward_config
from easyr1.trainer import Dist, Trainer
from tests.trainer_utils import read_metrics, tiny_config


@pytest.fixture()
def engine_logging() -> Iterator[logging.Logger]:
    """The ``easyr1`` logger as the test found it, restored afterwards (its handler writes to the
    test's captured stderr, which is gone once the test ends)."""
    engine = logging.getLogger("easyr1")
    level, handlers = engine.level, list(engine.handlers)
    yield engine
    engine.setLevel(level)
    engine.handlers[:] = handlers


def _parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ----------------------------------------------------------------------------- config ranges


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "worker.actor.optim.lr=-1.0e-6",
            "worker.actor.optim.lr: must lie in (0, inf), got -1e-06 (a negative lr",
        ),
        ("worker.actor.optim.lr=0", "worker.actor.optim.lr: must lie in (0, inf), got 0.0"),
        ("worker.actor.optim.lr=.nan", "worker.actor.optim.lr: must lie in (0, inf), got nan"),
        ("worker.critic.optim.lr=-1", "worker.critic.optim.lr: must lie in (0, inf), got -1.0"),
        (
            "worker.actor.optim.weight_decay=-0.01",
            "worker.actor.optim.weight_decay: must lie in [0, inf), got -0.01",
        ),
        ("worker.actor.optim.betas=[0.9,1.0]", "worker.actor.optim.betas[1]: must lie in [0, 1), got 1.0"),
        (
            "worker.actor.optim.lr_warmup_ratio=1.5",
            "worker.actor.optim.lr_warmup_ratio: must lie in [0, 1], got 1.5",
        ),
        (
            "worker.actor.optim.lr_warmup_steps=-3",
            "worker.actor.optim.lr_warmup_steps: must lie in [0, inf), got -3",
        ),
        (
            "worker.actor.optim.min_lr_ratio=-0.1",
            "worker.actor.optim.min_lr_ratio: must lie in [0, 1], got -0.1",
        ),
        ("worker.actor.max_grad_norm=0", "worker.actor.max_grad_norm: must lie in (0, inf), got 0.0"),
        ("worker.critic.max_grad_norm=-1", "worker.critic.max_grad_norm: must lie in (0, inf), got -1.0"),
        ("worker.actor.clip_ratio_low=1.5", "worker.actor.clip_ratio_low: must lie in [0, 1], got 1.5"),
        ("worker.actor.clip_ratio_high=-0.2", "worker.actor.clip_ratio_high: must lie in [0, inf), got -0.2"),
        ("worker.actor.clip_ratio_dual=1", "worker.actor.clip_ratio_dual: must lie in (1, inf), got 1.0"),
        ("worker.actor.tau_negative=0", "worker.actor.tau_negative: must lie in (0, inf), got 0.0"),
        ("worker.critic.cliprange_value=0", "worker.critic.cliprange_value: must lie in (0, inf), got 0.0"),
        ("algorithm.kl_coef=-0.1", "algorithm.kl_coef: must lie in [0, inf), got -0.1"),
        ("algorithm.kl_target=0", "algorithm.kl_target: must lie in (0, inf), got 0.0"),
        ("algorithm.gamma=1.1", "algorithm.gamma: must lie in [0, 1], got 1.1"),
        ("trainer.total_epochs=0", "trainer.total_epochs: must be positive, got 0"),
        ("worker.reward.timeout=0", "worker.reward.timeout: must lie in (0, inf), got 0.0"),
        ("trainer.stall_report_s=-1", "trainer.stall_report_s: must lie in [0, inf), got -1.0"),
        (
            "worker.rollout.val_override_config={n: 0}",
            "worker.rollout.val_override_config.n: must be positive, got 0",
        ),
        (
            "worker.rollout.val_override_config={temperature: abc}",
            "worker.rollout.val_override_config.temperature: expected a number, got 'abc'",
        ),
        (
            "worker.rollout.val_override_config={top_p: 5}",
            "worker.rollout.val_override_config.top_p: must lie in [0, 1], got 5.0",
        ),
    ],
)
def test_out_of_range_numbers_are_config_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([override])
    assert message in str(info.value)


def test_range_edges_that_algorithms_use_are_accepted() -> None:
    """CISPO sets clip_ratio_low=0, KL-free runs kl_coef=0, a warmup may last the whole run, a stall
    report may be off."""
    config = load_config(
        [
            "worker.actor.clip_ratio_low=0",
            "worker.actor.clip_ratio_high=4",
            "algorithm.kl_coef=0",
            "worker.actor.optim.lr_warmup_ratio=1",
            "trainer.stall_report_s=0",
            "worker.actor.optim.weight_decay=0",
            "trainer.total_epochs=1",
        ]
    )
    assert config.worker.actor.clip_ratio_low == 0.0 and config.algorithm.kl_coef == 0.0


def test_negative_lr_stops_easyr1_train_before_it_starts(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "trainer.n_gpus_per_node=1",
        "worker.actor.optim.strategy=adamw_bf16",
        "worker.actor.optim.lr=-1.0e-6",
    ]
    assert main(["train", *args]) == 2
    assert "config error: worker.actor.optim.lr: must lie in (0, inf), got -1e-06" in capsys.readouterr().err


def test_a_key_given_twice_in_a_config_file_is_an_error(tmp_path: Path) -> None:
    """YAML itself keeps the last of two ``trainer:`` blocks, dropping the first one's keys (here the
    checkpoint frequency) without a word."""
    path = tmp_path / "twice.yaml"
    path.write_text("trainer:\n  save_freq: 1\ndata:\n  rollout_batch_size: 8\ntrainer:\n  max_steps: 3\n")
    with pytest.raises(
        ConfigError, match=rf"(?s){re.escape(str(path))}: invalid YAML: key 'trainer' is given twice.*line 5"
    ):
        load_config([f"config={path}"])


def test_a_yaml_merge_key_is_not_a_key_given_twice(tmp_path: Path) -> None:
    """``<<: *anchor`` merges a mapping; a key written beside it overrides the merged one."""
    path = tmp_path / "merged.yaml"
    path.write_text("common: &common {save_freq: 1, max_steps: 3}\ntrainer:\n  <<: *common\n  max_steps: 5\n")
    trainer = read_yaml(path)["trainer"]
    assert trainer == {"save_freq": 1, "max_steps": 5}


def _alias_bomb(levels: int = 9) -> str:
    """A YAML document of about 1 KB whose aliases expand to 9**levels strings."""
    lines = ["      l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"      l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "worker:\n  reward:\n    reward_function_kwargs:\n" + "\n".join(lines) + "\n"


def _flow_alias_bomb(levels: int = 6) -> str:
    """The same on one line: 10**levels strings."""
    parts = ["&l0 [" + ", ".join(["x"] * 10) + "]"]
    parts += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def test_a_yaml_alias_bomb_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nine levels of nine aliases (1 KB) once made ``easyr1 config`` grow past 3 GB and ``easyr1
    train`` hang with an empty run folder: the file is refused, named, before any process starts."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    assert len(path.read_bytes()) < 1200
    for command in ("config", "train"):
        assert main([command, f"config={path}", f"trainer.save_checkpoint_path={tmp_path / 'run'}"]) == 2
        err = capsys.readouterr().err
        assert f"config error: {path}: invalid YAML: its aliases expand to more than 100000 values" in err, (
            err
        )
    assert not (tmp_path / "run").exists()
    # The same on the command line, and an alias that contains itself; a few aliases are fine.
    with pytest.raises(
        ConfigError, match="worker.reward.reward_function_kwargs.k: its aliases expand to more than"
    ):
        load_config([f"worker.reward.reward_function_kwargs.k={_flow_alias_bomb()}"])
    looped = tmp_path / "looped.yaml"
    looped.write_text("worker:\n  reward:\n    reward_function_kwargs:\n      k: &k [1, *k]\n")
    with pytest.raises(
        ConfigError, match=rf"{re.escape(str(looped))}: invalid YAML: an alias contains itself"
    ):
        load_config([f"config={looped}"])
    deep = tmp_path / "deep.yaml"  # no alias, but deeper than the recursive copies and printer of a config go
    deep.write_text(
        "worker:\n  reward:\n    reward_function_kwargs:\n      k: " + "[" * 400 + "]" * 400 + "\n"
    )
    with pytest.raises(
        ConfigError, match=rf"{re.escape(str(deep))}: invalid YAML: it nests deeper than 100 levels"
    ):
        load_config([f"config={deep}"])
    small = tmp_path / "small.yaml"
    small.write_text(_alias_bomb(levels=3))
    assert len(read_yaml(small)["worker"]["reward"]["reward_function_kwargs"]["l2"]) == 9


def _trainer_config(model: Path, **data: Any) -> PPOConfig:
    config = PPOConfig()
    config.worker.actor.model.model_path = str(model)
    config.worker.reward.reward_function = "math"
    config.worker.actor.global_batch_size = 4
    config.trainer.logger = ["file"]
    for key, value in {"min_pixels": None, "max_pixels": None, **data}.items():
        setattr(config.data, key, value)
    return config


def test_runs_without_training_data_or_with_too_little_stop_before_any_model(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """No data.train_files ("" would have scanned the working directory for any data file), and a
    data set smaller than one batch: each a config error naming the key and the file."""
    model, cpu = tiny_model("qwen2"), Dist(0, 1, 0, torch.device("cpu"))
    with pytest.raises(ConfigError, match="data.train_files is required"):
        Trainer(_trainer_config(model), cpu)
    rows = _parquet(
        tmp_path / "train.parquet", [{"problem": f"{i}+1?", "answer": str(i + 1)} for i in range(3)]
    )
    config = _trainer_config(model, train_files=str(rows), prompt_key="problem", rollout_batch_size=4)
    with pytest.raises(
        ConfigError, match=rf"data.train_files={re.escape(str(rows))}: 3 rows .* data.rollout_batch_size=4"
    ):
        Trainer(config, cpu)


def test_a_checkpoint_to_load_that_is_not_one_is_named_before_any_model(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    rows = _parquet(
        tmp_path / "train.parquet", [{"problem": f"{i}+1?", "answer": str(i + 1)} for i in range(8)]
    )
    config = _trainer_config(
        tiny_model("qwen2"), train_files=str(rows), prompt_key="problem", rollout_batch_size=4
    )
    config.trainer.save_checkpoint_path = str(tmp_path / "run")
    (tmp_path / "run" / "global_step_1").mkdir(parents=True)
    for path, message in [
        (tmp_path / "nowhere", "no such folder"),
        (tmp_path / "run", "is a run folder: pass one of its global_step_N folders"),
        (tmp_path / "run" / "global_step_1", "no completion marker"),
    ]:
        config.trainer.load_checkpoint_path = str(path)
        with pytest.raises(
            ConfigError, match=rf"trainer.load_checkpoint_path={re.escape(str(path))}.*{message}"
        ):
            Trainer(config, Dist(0, 1, 0, torch.device("cpu")))


# ----------------------------------------------------------------------------- reward file


def test_missing_reward_file_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "rewards" / "score.py"
    expected = f"worker.reward.reward_function: reward function file {missing} not found"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check_reward_config(
            load_config([f"worker.reward.reward_function={missing}:compute_score"]).worker.reward
        )
    assert main(["config", f"worker.reward.reward_function={missing}:compute_score"]) == 2
    assert expected in capsys.readouterr().err
    broken = tmp_path / "broken.py"
    broken.write_text("import not_installed_anywhere\n\ndef compute_score(inputs):\n    return []\n")
    with pytest.raises(ConfigError, match=r"broken\.py defines no 'main'"):
        check_reward_config(load_config([f"worker.reward.reward_function={broken}:main"]).worker.reward)
    # resolved, not run: no ImportError
    check_reward_config(load_config([f"worker.reward.reward_function={broken}:compute_score"]).worker.reward)


def test_trainer_loads_the_reward_before_any_model(tmp_path: Path, engine_logging: logging.Logger) -> None:
    """A config built in code skips ``load_config``; the Trainer still finds the missing reward
    file first, not after loading (here: failing to find) the model."""
    config = PPOConfig()
    config.worker.actor.model.model_path = str(tmp_path / "no_model_here")
    config.worker.reward.reward_function = f"{tmp_path / 'missing.py'}:main"
    config.data.train_files = str(tmp_path / "data")
    with pytest.raises(RewardFunctionError, match=r"missing\.py not found"):
        Trainer(config, Dist(0, 1, 0, torch.device("cpu")))


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("worker.actor.model.model_path=null", "worker.actor.model.model_path is required"),
        ("worker.reward.reward_function=null", "worker.reward.reward_function is required"),
        ("data.train_files=", "data.train_files is required"),
    ],
)
def test_a_run_without_a_model_reward_or_data_stops_before_any_rank_starts(
    tiny_model: Callable[[str], Path],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    missing: str,
    message: str,
) -> None:
    """Said once by the launcher, not once by every rank it had started."""
    args = [
        f"worker.actor.model.model_path={tiny_model('qwen2')}",
        "worker.reward.reward_function=math",
        f"data.train_files={tmp_path / 'data'}",
        "trainer.n_gpus_per_node=2",
        f"trainer.save_checkpoint_path={tmp_path / 'run'}",
    ]
    assert main(["train", *args, missing]) == 2
    err = capfd.readouterr().err
    assert err.count(message) == 1 and "rank" not in err, err


# ----------------------------------------------------------------------------- data


def test_null_or_nan_answers_name_file_and_row(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_model("qwen2"))
    config = DataConfig(prompt_key="problem", min_pixels=None, max_pixels=None)
    null = _parquet(
        tmp_path / "null.parquet", [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": None}]
    )
    nan = _parquet(
        tmp_path / "nan.parquet",
        [{"problem": "1+1?", "answer": 2.0}, {"problem": "2+2?", "answer": math.nan}],
    )
    lines = tmp_path / "null.jsonl"
    lines.write_text(
        "\n".join(
            json.dumps(row)
            for row in [{"problem": "a", "answer": "1"}] * 2 + [{"problem": "b", "answer": None}]
        )
    )
    for path, row in ((null, 1), (nan, 1), (lines, 2)):
        with pytest.raises(
            DatasetError,
            match=rf"{re.escape(str(path))} row {row}: answer 'answer' is missing \(null or NaN\)",
        ):
            RLDataset(str(path), tokenizer, None, config)


@pytest.mark.parametrize(
    "template",
    [
        "{{ cycler.__init__.__globals__.os.system('touch ' ~ marker) }}{{ content }}",
        "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
        "{{ c(['touch', marker]) }}{% endif %}{% endfor %}{{ content }}",
    ],
)
def test_format_prompt_cannot_reach_python(
    tiny_model: Callable[[str], Path], tmp_path: Path, template: str
) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.jinja"
    path.write_text("{% set marker = '" + str(marker) + "' %}" + template)
    data = _parquet(tmp_path / "rows.parquet", [{"problem": "1+1?", "answer": "2"}])
    config = DataConfig(prompt_key="problem", min_pixels=None, max_pixels=None, format_prompt=str(path))
    with pytest.raises(
        DatasetError, match=rf"data\.format_prompt {re.escape(str(path))}: SecurityError: .*unsafe"
    ):
        RLDataset(str(data), load_tokenizer(tiny_model("qwen2")), None, config)
    assert not marker.exists()


def test_a_checkpoint_folder_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("")
    with pytest.raises(ConfigError, match=f"trainer.save_checkpoint_path: {tmp_path / 'run'} is a file"):
        load_config([f"trainer.save_checkpoint_path={tmp_path / 'run'}"])


def test_a_truncated_parquet_file_is_named(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    path = _parquet(tmp_path / "rows.parquet", [{"problem": "1+1?", "answer": "2"}] * 4)
    path.write_bytes(path.read_bytes()[:-20])  # a copy cut short
    with pytest.raises(DatasetError, match=rf"{re.escape(str(path))}: cannot be read as parquet"):
        RLDataset(str(path), load_tokenizer(tiny_model("qwen2")), None, DataConfig(prompt_key="problem"))


def test_a_name_the_format_prompt_misspells_is_an_error(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """Jinja renders an unknown name as "": every prompt would lose its problem text without a word."""
    path = tmp_path / "typo.jinja"
    path.write_text("Solve: {{ contnt }}")
    data = _parquet(tmp_path / "rows.parquet", [{"problem": "1+1?", "answer": "2"}])
    config = DataConfig(prompt_key="problem", min_pixels=None, max_pixels=None, format_prompt=str(path))
    with pytest.raises(
        DatasetError,
        match=rf"data\.format_prompt {re.escape(str(path))}: UndefinedError: 'contnt' is undefined",
    ):
        RLDataset(str(data), load_tokenizer(tiny_model("qwen2")), None, config)


def test_a_format_prompt_that_fails_on_a_row_names_the_row(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """A template's own error (here 1 divided by the row's length, 0 on the empty problem) names the
    data set's row and the template, not a traceback from every rank."""
    path = tmp_path / "div.jinja"
    path.write_text("{{ content }} ({{ 1 // (content | length) }})")
    data = _parquet(
        tmp_path / "rows.parquet", [{"problem": "1+1?", "answer": "2"}, {"problem": "", "answer": "0"}]
    )
    config = DataConfig(prompt_key="problem", min_pixels=None, max_pixels=None, format_prompt=str(path))
    with pytest.raises(
        DatasetError,
        match=rf"rows.parquet row 1: data\.format_prompt {re.escape(str(path))}: ZeroDivisionError",
    ):
        RLDataset(str(data), load_tokenizer(tiny_model("qwen2")), None, config)


def test_logging_follows_the_rank(capsys: pytest.CaptureFixture[str], engine_logging: logging.Logger) -> None:
    """Rank 0 shows the engine's INFO records (a data set losing rows); other ranks only warnings."""
    log = logging.getLogger("easyr1.data.dataset")
    configure_logging(1)
    log.info("dropped 3 of 4")
    log.warning("a warning")
    assert capsys.readouterr().err == "[rank 1] WARNING easyr1.data.dataset: a warning\n"
    configure_logging(0)
    configure_logging(0)  # a second Trainer in the process: still one line per record
    log.info("dropped 3 of 4")
    assert capsys.readouterr().err == "[rank 0] INFO easyr1.data.dataset: dropped 3 of 4\n"


# ----------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def custom_code_model(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 with code of its own (``auto_map``): subclasses that change nothing but their names."""
    folder = tmp_path_factory.mktemp("custom") / "model"
    shutil.copytree(tiny_model("qwen2"), folder)
    (folder / "custom_code.py").write_text(
        "from transformers import Qwen2ForCausalLM, Qwen2ForTokenClassification\n\n\n"
        "class CustomForCausalLM(Qwen2ForCausalLM):\n    pass\n\n\n"
        "class CustomForTokenClassification(Qwen2ForTokenClassification):\n    pass\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {
        "AutoModelForCausalLM": "custom_code.CustomForCausalLM",
        "AutoModelForTokenClassification": "custom_code.CustomForTokenClassification",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _class_names(model: torch.nn.Module) -> list[str]:
    return [cls.__name__ for cls in type(model).__mro__]


def test_a_damaged_weight_file_or_a_mistyped_override_names_the_model(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    from easyr1.models.loading import ModelLoadError

    folder = tmp_path / "model"
    shutil.copytree(tiny_model("qwen2"), folder)
    with pytest.raises(ConfigError, match="override_config: .*hidden_size"):
        load_model(folder, override_config={"hidden_size": "abc"})
    # A value the config takes but the model cannot be built with: once a raw KeyError traceback.
    for weights in (True, False):
        with pytest.raises(
            ConfigError,
            match=r"override_config.hidden_act=bogus_activation: Qwen2Config of .* cannot be built",
        ):
            load_model(folder, override_config={"hidden_act": "bogus_activation"}, weights=weights)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut short
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(folder))}: cannot load the model's weights"):
        load_model(folder)


def test_trust_remote_code_decides_whose_code_loads(custom_code_model: Path) -> None:
    assert (
        type(load_model(custom_code_model)).__name__ == "Qwen2ForCausalLM"
    )  # the tools' default: built-ins only
    assert type(load_model(custom_code_model, trust_remote_code=False)).__name__ == "Qwen2ForCausalLM"
    assert type(load_model(custom_code_model, trust_remote_code=True)).__name__ == "CustomForCausalLM"
    assert (
        type(load_value_model(custom_code_model, trust_remote_code=False)).__name__
        == "Qwen2ForTokenClassification"
    )
    assert (
        type(load_value_model(custom_code_model, trust_remote_code=True)).__name__
        == "CustomForTokenClassification"
    )


def test_missing_model_folder_is_not_looked_up_on_the_hub_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``models/qwen`` (one ``/``, not here) would be a Hub model id; offline, no cached model of
    that name means an error at once, naming the path, and the fall-back is said once."""
    assert is_offline_mode(), "the test suite runs with HF_HUB_OFFLINE=1"
    monkeypatch.chdir(tmp_path)
    expected = f"model folder not found: models/qwen (relative to {tmp_path}), and HF_HUB_OFFLINE=1"
    for load in (load_tokenizer, load_model, read_config):
        with pytest.raises(FileNotFoundError, match=re.escape(expected)):
            load("models/qwen")
    said = capsys.readouterr().err
    assert said.count("'models/qwen': no such folder in") == 1, said


# ----------------------------------------------------------------------------- a run


def test_run_logs_and_records_dropped_prompts(
    custom_code_model: Path,
    tmp_path: Path,
    one_rank: None,
    capsys: pytest.CaptureFixture[str],
    engine_logging: logging.Logger,
) -> None:
    """A validation-only run on one rank, in process: rank 0 logs the rows the length filter
    dropped, and the first record of metrics.jsonl counts them. The model's own code runs, as
    worker.actor.model.trust_remote_code (true by default, as in EasyR1) says it should."""
    short = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]
    long = [{"problem": "long " * 300, "answer": "0"}]
    _parquet(tmp_path / "data" / "train.parquet", short + long * 2)
    _parquet(tmp_path / "data" / "test.parquet", short[:2] + long)
    run_dir = tmp_path / "run"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(custom_code_model, tmp_path / "data", run_dir)))
    config = load_config([f"config={path}", "trainer.val_only=true"])
    configure_logging(0)  # as launch.rank.run does before the Trainer
    trainer = Trainer(config, Dist(0, 1, 0, torch.device("cpu")))
    try:
        trainer.fit()
    finally:
        trainer.close()
    err = capsys.readouterr().err
    assert (
        f"[rank 0] INFO easyr1.data.dataset: {tmp_path / 'data'}@train: dropped 2 of 6 prompts longer" in err
    )
    assert f"{tmp_path / 'data'}@test: dropped 1 of 3 prompts" in err
    [record] = read_metrics(run_dir)
    assert record["step"] == 0 and "val/reward_score" in record
    assert (record["data/filtered_prompts"], record["data/filtered_val_prompts"]) == (2.0, 1.0)
    assert "CustomForCausalLM" in _class_names(trainer.actor_model)
