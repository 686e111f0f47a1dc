"""Where step metrics and validation samples go: EasyR1's ``trainer.logger`` names.

``console`` and ``file`` need nothing; ``tensorboard``, ``wandb``, ``swanlab`` and ``mlflow``
need their package, and asking for one that is not installed is an error before anything starts.
Each service keeps its own configuration: ``WANDB_MODE=offline``, ``SWANLAB_MODE=offline``,
``MLFLOW_TRACKING_URI``. Without a tracking URI MLflow writes a file store under the run folder,
so nothing leaves the machine unless asked to. Only rank 0 makes a Tracker.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Protocol

from easyr1.config import ConfigError

# The file logger's JSON lines, one object with a "step" per line.
JSONL_FILES = ("metrics.jsonl", "generations.jsonl")
# Logger name -> (module to import, pip package to install).
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "swanlab": ("swanlab", "swanlab"),
    "mlflow": ("mlflow", "mlflow"),
}


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"metric {key!r} is not a number: {value!r}") from None
    return out


def generations_table(samples: list[dict[str, Any]]) -> str:
    """A Markdown table of validation samples (TensorBoard renders it; it also reads as plain text)."""
    columns = list(dict.fromkeys(key for sample in samples for key in sample))

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(s.get(c, "")) for c in columns) + " |" for s in samples]
    return "\n".join(lines)


class _Backend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None: ...
    def close(self) -> None: ...


class _Console:
    """One line per step, keys sorted so the same metric sits in the same place every step."""

    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict[str, Any]):
        self.prefix = f"[{project}/{experiment}]"

    def log(self, metrics: dict[str, float], step: int) -> None:
        body = " | ".join(f"{key}={value:.4g}" for key, value in sorted(metrics.items()))
        print(f"{self.prefix} step {step} | {body}", flush=True)

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        for sample in samples:
            print(f"{self.prefix} val step {step}: {json.dumps(sample, ensure_ascii=False)}", flush=True)

    def close(self) -> None:
        pass


class _File:
    """JSON lines, flushed every step, so a crashed run keeps every step it logged."""

    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict[str, Any]):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics, self.generations = ((run_dir / name).open("a") for name in JSONL_FILES)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.metrics.write(json.dumps({"step": step, **metrics}) + "\n")
        self.metrics.flush()

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        for sample in samples:
            self.generations.write(json.dumps({"step": step, **sample}, ensure_ascii=False) + "\n")
        self.generations.flush()

    def close(self) -> None:
        self.metrics.close()
        self.generations.close()


def _step_of(line: str) -> float:
    """A log line's step; a torn line (the run died while writing it) counts as past every step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def set_aside_jsonl(run_dir: Path) -> list[Path]:
    """A run that starts from step 0 in a folder holding an earlier run's log files (no checkpoint
    to resume, or ``trainer.find_last_checkpoint=false``) must not log after that run's steps:
    rename its files to ``NAME.before-TIMESTAMP.jsonl``, kept, not deleted. The new names."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for name in JSONL_FILES:
        path = Path(run_dir) / name
        if path.is_file() and path.stat().st_size:
            moved.append(path.rename(path.with_name(f"{path.stem}.before-{stamp}.jsonl")))
    return moved


def truncate_jsonl(run_dir: Path, step: int) -> None:
    """Drop the lines of steps after ``step`` from the file logger's files: a run resumed from step N
    logs N+1, N+2, ... again, and each step must appear once. Rewritten in place, not replaced, so a
    file already opened for appending keeps appending to it."""
    for name in JSONL_FILES:
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _step_of(line) <= step]
        if len(kept) < len(lines):
            with path.open("r+") as stream:
                stream.write("".join(kept))
                stream.truncate()


class _TensorBoard:
    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        self.writer.add_text("val/generations", generations_table(samples), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict[str, Any]):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=project, name=experiment, config=config, dir=str(run_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        columns = list(dict.fromkeys(key for sample in samples for key in sample))
        # A table column takes one scalar type: a structured ground truth (a list, a dict) goes as text.
        rows = [
            [v if v is None or isinstance(v, (str, int, float)) else str(v) for v in map(sample.get, columns)]
            for sample in samples
        ]
        self.run.log({"val/generations": self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class _SwanLab:
    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict[str, Any]):
        import swanlab

        self.swanlab = swanlab
        log_dir = run_dir / "swanlog"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.run = swanlab.init(project=project, name=experiment, config=config, log_dir=str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        self.run.log({"val/generations": self.swanlab.Text(generations_table(samples))}, step=step)

    def close(self) -> None:
        self.run.finish()


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


class _MLflow:
    """Through a client bound to one run, not mlflow's global active run."""

    MAX_PARAM_VALUE, BATCH = 6000, 100  # MLflow's limits on a parameter's value and on a batch's length

    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict[str, Any]):
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # MLflow 3 refuses its file store unless this is set; a local store is the point here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (run_dir / "mlruns").resolve().as_uri()
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.Metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(project)
        experiment_id = found.experiment_id if found else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment_id, run_name=experiment).info.run_id
        params = [Param(self._key(k), v[: self.MAX_PARAM_VALUE]) for k, v in _flatten(config).items()]
        for start in range(0, len(params), self.BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + self.BATCH])

    @staticmethod
    def _key(name: str) -> str:
        """MLflow accepts letters, digits, ``_ - . / space`` in names."""
        return re.sub(r"[^\w\-./ ]", "_", name)

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self.Metric(self._key(k), v, now, step) for k, v in metrics.items()]
        for start in range(0, len(batch), self.BATCH * 10):  # 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=batch[start : start + self.BATCH * 10])

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        self.client.log_text(self.run_id, generations_table(samples), f"generations/step_{step}.md")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, type] = {
    "console": _Console,
    "file": _File,
    "tensorboard": _TensorBoard,
    "wandb": _Wandb,
    "swanlab": _SwanLab,
    "mlflow": _MLflow,
}


def check_loggers(names: list[str]) -> None:
    """Fail early, naming the pip package, when a requested logger cannot be used."""
    for name in names:
        if name not in BACKENDS:
            raise ConfigError(f"trainer.logger: unknown logger {name!r}; choose from {', '.join(BACKENDS)}")
        if name in PACKAGES and importlib.util.find_spec(PACKAGES[name][0]) is None:
            raise ConfigError(
                f"trainer.logger includes {name!r} but its package is not installed: "
                f"pip install {PACKAGES[name][1]} (or drop it from trainer.logger)"
            )


class Tracker:
    """Fans metrics out to every requested logger. Make one on rank 0 only; ``close()`` at the end."""

    def __init__(
        self, names: list[str], run_dir: Path, project: str, experiment: str, config: dict[str, Any]
    ):
        names = list(dict.fromkeys(names))
        check_loggers(names)
        run_dir = Path(run_dir)
        self.backends: list[_Backend] = [BACKENDS[n](run_dir, project, experiment, config) for n in names]

    def log(self, metrics: dict[str, Any], step: int) -> None:
        values = _floats(metrics)
        for backend in self.backends:
            backend.log(values, step)

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        if samples:
            for backend in self.backends:
                backend.log_generations(samples, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
