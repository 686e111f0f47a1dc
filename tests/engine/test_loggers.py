"""Loggers write what a run logged, read back with each tool's own reader (no network)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from easyr1.config import ConfigError
from easyr1.loggers import Tracker, generations_table, truncate_jsonl

CONFIG = {"algorithm": {"adv_estimator": "grpo", "kl_coef": 0.001}, "trainer": {"logger": ["file"]}}
STEPS = {
    1: {"reward/overall": 0.25, "actor/pg_loss": -0.5},
    2: {"reward/overall": 0.5, "actor/pg_loss": -0.25},
}
SAMPLES = [{"prompt": "1+1?", "response": "it is | 2\ndone", "ground_truth": "2", "overall": 1.0}]


def _run(names: list[str], run_dir: Path) -> None:
    tracker = Tracker(names, run_dir, project="proj", experiment="exp1", config=CONFIG)
    for step, metrics in STEPS.items():
        tracker.log(metrics, step)
    tracker.log_generations(SAMPLES, 2)
    tracker.close()


def test_console_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(["console", "file"], tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[proj/exp1] step 1 | actor/pg_loss=-0.5 | reward/overall=0.25"
    assert "val step 2" in out[2] and "it is | 2" in out[2]
    _run(["file"], tmp_path)  # a resumed run appends
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": s, **m} for s, m in STEPS.items()] * 2
    generations = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert generations[0] == {"step": 2, **SAMPLES[0]} and len(generations) == 2


def test_resume_truncates_the_jsonl_files_to_its_step(tmp_path: Path) -> None:
    """A run resumed from step 1 logs step 2 again: the old step 2 (and a line torn by the crash) go,
    and the tracker that was opened before the truncation appends after what is kept."""
    tracker = Tracker(["file"], tmp_path, project="proj", experiment="exp1", config=CONFIG)
    for step, metrics in STEPS.items():
        tracker.log(metrics, step)
    tracker.log_generations(SAMPLES, 1)
    tracker.log_generations(SAMPLES, 2)
    with (tmp_path / "metrics.jsonl").open("a") as torn:
        torn.write('{"step": 3, "reward/ove')
    truncate_jsonl(tmp_path, 1)
    tracker.log(STEPS[2], 2)
    tracker.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": s, **m} for s, m in STEPS.items()]
    generations = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert [g["step"] for g in generations] == [1]


def test_tensorboard_events_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(["tensorboard"], tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    for key in STEPS[1]:
        assert [(e.step, e.value) for e in events.Scalars(key)] == [(s, m[key]) for s, m in STEPS.items()]
    text = events.Tensors("val/generations/text_summary")
    assert text[0].step == 2 and "it is \\| 2" in text[0].tensor_proto.string_val[0].decode()


def test_mlflow_file_store_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):  # unset, and restored afterwards
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    _run(["mlflow"], tmp_path)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert run.info.run_name == "exp1" and run.info.status == "FINISHED"
    for key in STEPS[1]:
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] == [
            (s, m[key]) for s, m in STEPS.items()
        ]
    assert run.data.params["algorithm.adv_estimator"] == "grpo"
    table = Path(client.download_artifacts(run.info.run_id, "generations/step_2.md", str(tmp_path)))
    assert table.read_text() == generations_table(SAMPLES)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _run(["wandb"], tmp_path)
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert run_file.stat().st_size > 0


@pytest.mark.skipif(importlib.util.find_spec("swanlab") is None, reason="swanlab not installed")
def test_swanlab_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    _run(["swanlab"], tmp_path)
    (run_file,) = (tmp_path / "swanlog").glob("run-*/run-*.swanlab")
    assert run_file.stat().st_size > 0


def test_missing_package_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "mlflow" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match="pip install mlflow"):
        Tracker(["file", "mlflow"], tmp_path, "p", "e", {})
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing started before the check
    with pytest.raises(ConfigError, match="unknown logger 'neptune'"):
        Tracker(["neptune"], tmp_path, "p", "e", {})


def test_non_numeric_metric_is_named(tmp_path: Path) -> None:
    tracker = Tracker(["file"], tmp_path, "p", "e", {})
    with pytest.raises(TypeError, match="'reward/text'"):
        tracker.log({"reward/text": "high"}, 1)
    tracker.close()


def test_a_fresh_start_sets_an_earlier_runs_logs_aside(tmp_path: Path) -> None:
    from easyr1.loggers import set_aside_jsonl

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (tmp_path / "generations.jsonl").write_text("")  # empty: nothing to keep
    moved = set_aside_jsonl(tmp_path)
    assert [p.name.split(".before-")[0] for p in moved] == ["metrics"]
    assert moved[0].read_text() == '{"step": 1}\n{"step": 2}\n' and not (tmp_path / "metrics.jsonl").exists()
    assert set_aside_jsonl(tmp_path) == []
