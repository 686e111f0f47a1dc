"""The images as source (containers/) and the Apptainer environment's pieces: each definition is
spython's conversion of its Dockerfile, each Dockerfile is what the pins make it, and the stand-in
the harness tests run Apptainer with shows a command only what is bound (so that those tests
mean something: a bind the harness forgot fails them)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import tomllib

from rules.scripts import containers, engine
from tests.harness.sandbox import build_image, path_with_stand_in, require_bubblewrap

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "containers").glob("*.Dockerfile"))


def test_every_definition_is_spythons_conversion_of_its_dockerfile():
    assert [p.stem for p in DOCKERFILES] == ["cpu", "gpu"]
    assert sorted((REPO / "containers").glob("*.def")) == [p.with_suffix(".def") for p in DOCKERFILES]
    for dockerfile in DOCKERFILES:
        assert dockerfile.with_suffix(".def").read_text() == containers.definition(dockerfile), (
            f"{dockerfile.with_suffix('.def').name} is stale: run `make containers`"
        )


def test_the_dockerfiles_are_written_from_the_pins_the_project_keeps():
    assert containers.stale() == [], "run `make containers`"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    cpu, gpu = ((REPO / "containers" / f"{name}.Dockerfile").read_text() for name in ("cpu", "gpu"))
    # The CPU image installs what `make setup` does, pin for pin: the Makefile's torch first.
    torch = re.search(r"^TORCH \?= (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert f'"{torch}"' in cpu
    # (A range whose top is the tested pin is installed at that pin: images hold exact versions.)
    for spec in [*project["dependencies"], *project["optional-dependencies"]["harness"]]:
        assert spec.startswith("torch") or f'"{containers.as_pinned(spec)}"' in cpu, spec
    # The GPU image: the recorded stack, each package pinned once (the record's transformers is not
    # pyproject.toml's: vLLM 0.24's Qwen-VL profiling failed with 5.24), the rest as pyproject.toml.
    record = json.loads(containers.GPU_RECORD.read_text())
    for name in containers.GPU_STACK:
        assert f'"{name}=={record[name].split("+")[0]}"' in gpu and gpu.count(f'"{name}') == 1, name
    for spec in [*project["optional-dependencies"]["lora"], *project["optional-dependencies"]["ray"]]:
        assert f'"{containers.as_pinned(spec)}"' in gpu, spec
    for text in (cpu, gpu):  # official base images, packages by name: no mirror, nothing site-specific
        assert "http" not in text and "mirror" not in text


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    require_bubblewrap()
    return build_image(tmp_path_factory.getbasetemp() / "apptainer-image")


def apptainer(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path_with_stand_in(), "SECRET": "from the host"}
    return subprocess.run(["apptainer", *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_the_stand_in_shows_only_what_is_bound_and_a_clean_environment(image, tmp_path):
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    data.mkdir()
    (data / "file").write_text("data")
    look = 'echo "$SECRET|$HOME|$PATH|$(pwd)"; echo written > "$HOME/out"; cat "$1/file"'
    plain = apptainer(
        "exec",
        "--home",
        str(home),
        "--nv",
        "--cleanenv",
        str(image),
        "sh",
        "-c",
        look,
        "sh",
        str(data),
        cwd=home,
    )
    assert plain.returncode != 0 and "No such file" in plain.stderr  # data is not bound
    assert plain.stdout.startswith(f"|{home}|/opt/easyr1/venv/bin:")  # no host variable; the image's PATH
    assert plain.stdout.rstrip().endswith(f"|{home}") and (home / "out").read_text() == "written\n"

    bound = apptainer(
        "exec",
        "--home",
        str(home),
        "--bind",
        str(data),
        str(image),
        "sh",
        "-c",
        look,
        "sh",
        str(data),
        cwd=tmp_path,
    )  # a working directory that is not visible: the home instead
    assert bound.returncode == 0, bound.stderr
    assert bound.stdout == f"from the host|{home}|{bound.stdout.split('|')[2]}|{home}\ndata"
    assert not Path(image, "out").exists() and (data / "file").read_text() == "data"


def test_the_engine_runs_in_the_image_only_with_its_source_bound(image, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the working directory is the container's home: not the checkout
    monkeypatch.setenv("PATH", path_with_stand_in())
    assert engine.binds([], tmp_path) == (str(engine.engine_root()),)
    bound = engine.Container(str(image), "--nv --cleanenv", engine.binds([], tmp_path), "0123abc")
    inside, native = engine.describe(bound), engine.describe()
    assert inside["fingerprint"] == native["fingerprint"] and inside["git"] == "0123abc"
    assert inside["torch"] == native["torch"]  # this image holds this machine's stack
    with pytest.raises(RuntimeError, match="No module named 'easyr1'"):
        engine.describe(engine.Container(str(image), "--nv --cleanenv", (), "0123abc"))


def test_a_task_of_srun_hands_its_rank_to_the_engine_in_the_image(image, tmp_path, monkeypatch):
    """A cell of several nodes with launcher srun runs ``srun ... apptainer exec --cleanenv IMAGE
    easyr1 train``: each task's rank is in SLURM variables that --cleanenv drops, and without them
    every task would train alone as rank 0 of 1, all into the same cell. (srun stands in as ``env``
    with the variables it sets in a task: the 2-node SLURM of .ci/slurm-multinode.sh runs native
    cells.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", path_with_stand_in())
    container = engine.Container(str(image), "--nv --cleanenv", engine.binds([], tmp_path), "0123abc")
    task = {
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": "1",
        "SLURM_NODEID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    }
    srun = ("env", *(f"{name}={value}" for name, value in task.items()))
    look = "import os; from easyr1.launch.slurm import rank_env; print(rank_env(os.environ))"
    inner = engine._in_container(
        shlex.join(["env", f"PYTHONPATH={engine.engine_root()}", "python3", "-c", look]), container
    )
    alone = subprocess.run([*srun, *inner], capture_output=True, text=True)
    assert alone.returncode == 0 and alone.stdout.strip() == "None", alone.stderr  # what --cleanenv leaves

    # engine.run, as the train rule calls it for such a cell (its command swapped for the look).
    monkeypatch.setattr(engine, "command", lambda args, threads, container: inner)
    log = tmp_path / "train.log"
    assert engine.run(["train"], str(log), 1, container, srun, {"SLURM_JOB_NUM_NODES": "2"}) == 0, (
        log.read_text()
    )
    seen = log.read_text().splitlines()[-1]
    assert seen == str(
        {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "n1",
            "MASTER_PORT": seen.split("'MASTER_PORT': '")[1].split("'")[0],
        }
    )
