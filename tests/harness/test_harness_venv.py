"""Cells of the baselines matrix in a dependency combination's virtualenv (``environment: venv``):
the job that builds it comes first, bad configs name their key, a native cell's hash is what it
always was, and one real run of a tiny matrix has preparation, a cell and its merge in the
``oldest`` combination of configs/deps/cpu.yaml (the one CI's dependency matrix builds too, from
the same cache), beside a native cell and a cell whose combination cannot install."""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from rules.scripts import deps, engine
from tests.harness.test_harness import REPO, TINY, snakemake, write_matrix
from tests.page import markdown_table

pytestmark = pytest.mark.slow

DEPS = "configs/deps/cpu.yaml"
COMBINATION = "oldest"  # configs/deps/ci.yaml's too: CI's dependency matrix shares its virtualenv


def combination_key(name: str = COMBINATION) -> str:
    return deps.env_key(deps.spec(deps.load(REPO / DEPS), name))


def in_venv(matrix: dict, **deps_keys: str) -> dict:
    """``matrix``'s grid as one native block (grpo) and one block (gspo) in the combination's venv."""
    block = {"models": ["qwen2"], "datasets": ["arithmetic"], "precisions": ["amp"]}
    matrix["grid"] = [
        {**block, "algorithms": ["grpo"]},
        {
            **block,
            "algorithms": ["gspo"],
            "environment": "venv",
            "deps": deps_keys or {"file": DEPS, "combination": COMBINATION},
        },
    ]
    return matrix


def jobs(result: subprocess.CompletedProcess, rule: str) -> list[str]:
    """The dry run's blocks of the jobs of ``rule``."""
    assert result.returncode == 0, result.stdout + result.stderr
    blocks = re.split(r"\n(?=\[\w{3} \w{3} )", result.stdout + result.stderr)
    return [block for block in blocks if re.search(rf"^(local)?rule {rule}:", block, re.M)]


def inputs(block: str) -> list[str]:
    found = re.search(r"^\s+input: (.*)$", block, re.M)
    return found.group(1).split(", ") if found else []


def job_of(blocks: list[str], cell: str) -> str:
    return next(block for block in blocks if f"wildcards: cell={cell}\n" in block)


def test_a_venv_cell_depends_on_the_job_that_builds_its_virtualenv(tmp_path, monkeypatch):
    """The file from the matrix, the combination from the block; preparation stays native."""
    monkeypatch.setenv("EASYR1_DEPS_CACHE", str(tmp_path / "cache"))  # nothing built: the plan builds it

    def change(matrix: dict) -> None:
        in_venv(matrix, combination=COMBINATION)
        matrix["deps"] = {"file": DEPS}

    result = snakemake(tmp_path, write_matrix(tmp_path / "venv.yaml", change), "-n")
    key = combination_key()
    record = f"runs/prepared/venv/{COMBINATION}-{key}.json"
    [venv] = jobs(result, "venv")
    assert f"output: {record}\n" in venv and f"wildcards: combination={COMBINATION}, key={key}\n" in venv
    trains = jobs(result, "train")
    assert record in inputs(job_of(trains, "qwen2-gspo-arithmetic-amp"))
    assert not any("runs/prepared/venv/" in i for i in inputs(job_of(trains, "qwen2-grpo-arithmetic-amp")))
    for rule in ("tiny_model", "synthetic_data", "warm_start"):  # the matrix's environment: native
        assert all(
            not any("runs/prepared/venv/" in i for i in inputs(block)) for block in jobs(result, rule)
        ), rule
    # How the cell's engine will run: the combination's interpreter, the checkout's engine.
    output = (result.stdout + result.stderr).splitlines()
    line = next(line for line in output if line.startswith("qwen2-gspo-arithmetic-amp runs in "))
    assert line == (
        f"qwen2-gspo-arithmetic-amp runs in venv {COMBINATION} ({DEPS}): env PYTHONPATH={REPO} "
        f"{tmp_path / 'cache' / key / 'bin' / 'python'} -m easyr1.cli train config=runs/qwen2-gspo-arithmetic-amp/cell.yaml"
    )


def test_preparation_runs_in_the_matrix_venv_and_merges_in_the_cells(tmp_path):
    def change(matrix: dict) -> None:
        matrix.update(environment="venv", deps={"file": DEPS, "combination": COMBINATION})
        matrix["algorithms"]["gspo"]["trainer.save_freq"] = 1

    result = snakemake(tmp_path, write_matrix(tmp_path / "venv.yaml", change), "-n")
    record = f"runs/prepared/venv/{COMBINATION}-{combination_key()}.json"
    assert len(jobs(result, "venv")) == 1
    for rule in ("tiny_model", "synthetic_data", "warm_start", "train", "merge"):
        blocks = jobs(result, rule)
        assert blocks and all(record in inputs(block) for block in blocks), rule


def deps_file_without_suite(path: Path) -> str:
    matrix = yaml.safe_load((REPO / DEPS).read_text())
    del matrix["suite"]
    path.write_text(yaml.safe_dump(matrix))
    return str(path)


def deps_file_with_a_key_twice(path: Path) -> str:
    """The dependency matrix with a second ``python:``, which a plain YAML load would keep silently."""
    path.write_text((REPO / DEPS).read_text() + "\npython: '3.12'\n")
    return str(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda m, _: m["grid"][0].update(environment="venv"),
            "grid[0]: qwen2: environment venv needs deps.file (deps: on the block, model or matrix)",
        ),
        (
            lambda m, _: m["grid"][0].update(environment="venv", deps={"file": DEPS}),
            "grid[0]: qwen2: environment venv needs deps.combination (deps: on the block, model or matrix)",
        ),
        (
            lambda m, _: m.update(environment="venv", deps={"file": DEPS}),
            "deps.combination: environment venv needs a dependency combination "
            "(deps: {file: ..., combination: ...}): preparation runs in the matrix's",
        ),
        (
            lambda m, _: m["grid"][0].update(
                environment="venv", deps={"file": DEPS, "combination": "newest"}
            ),
            f"grid[0].deps.combination: unknown combination 'newest' in {DEPS}; defined: pinned, "
            "transformers-5.17, torch-2.11, torch-2.14, torch-2.15, latest, easyr1-stack, oldest",
        ),
        (
            lambda m, _: m["grid"][0].update(
                environment="venv", deps={"file": DEPS, "combination": "latest"}
            ),
            f"grid[0].deps.combination: combination 'latest' of {DEPS} pins latest releases: "
            "a cell needs fixed versions",
        ),
        (
            lambda m, _: (
                m["grid"][0].update(environment="venv", deps={"file": DEPS}),
                m["models"]["qwen2"].update(deps={"combination": "newest"}),
            ),
            "models.qwen2.deps.combination: unknown combination 'newest'",
        ),
        (
            lambda m, _: m["grid"][0].update(
                environment="venv", deps={"file": "configs/deps/nowhere.yaml", "combination": "x"}
            ),
            f"grid[0].deps.file: file not found: {REPO / 'configs/deps/nowhere.yaml'}",
        ),
        (
            lambda m, tmp: m["grid"][0].update(
                environment="venv",
                deps={"file": deps_file_without_suite(tmp / "deps.yaml"), "combination": "pinned"},
            ),
            "deps.yaml does not fit configs/schema/deps.schema.yaml: (top level): 'suite' is a required property",
        ),
        (
            lambda m, tmp: m["grid"][0].update(
                environment="venv",
                deps={"file": deps_file_with_a_key_twice(tmp / "deps.yaml"), "combination": "pinned"},
            ),
            "deps.yaml: invalid YAML: key 'python' is given twice",
        ),
        (lambda m, _: m.update(deps={"combo": "oldest"}), "'combo' was unexpected"),
        (
            lambda m, _: m.update(environment="virtualenv"),
            "'virtualenv' is not one of ['native', 'apptainer', 'venv']",
        ),
    ],
    ids=[
        "block-without-deps",
        "block-without-combination",
        "matrix-without-combination",
        "unknown-combination",
        "latest-combination",
        "unknown-combination-on-the-model",
        "missing-deps-file",
        "deps-file-off-schema",
        "deps-file-key-twice",
        "unknown-deps-key",
        "unknown-environment",
    ],
)
def test_venv_config_errors_name_the_key(change, message, tmp_path):
    result = snakemake(tmp_path, write_matrix(tmp_path / "bad.yaml", lambda m: change(m, tmp_path)), "-n")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


def test_an_install_record_says_whether_its_virtualenv_can_run_and_when_to_build_it_again(tmp_path):
    env = tmp_path / "env"
    env.mkdir()
    record = tmp_path / "install.json"
    ok = {"key": "k", "env": str(env), "pins": {}, "attempt": "", "status": "ok", "finished": "T1"}
    record.write_text(json.dumps(ok))
    assert deps.install_attempt(tmp_path / "none.json") == ""
    assert deps.virtualenv(record)[1] == f"its virtualenv {env} is gone: run again to rebuild it"
    gone = deps.install_attempt(record)
    assert gone == f"{env} was gone after T1"
    (env / "easyr1-deps.json").write_text("{}")  # built again, with the param it was built with
    record.write_text(json.dumps({**ok, "attempt": gone}))
    assert deps.install_attempt(record) == gone and deps.virtualenv(record) == (engine.Virtualenv(env), "")
    record.write_text(json.dumps({**ok, "status": "failed", "error": "no such version", "failed_at": "T2"}))
    assert deps.install_attempt(record) == "after the failure at T2"
    assert deps.virtualenv(record)[1].endswith(f"did not install ({record}):\nno such version")


# The e2e matrix: preparation in the combination (the matrix's environment), a native grpo cell, a
# gspo cell that saves its last step (merged in the combination too), and a cell whose combination
# pins a transformers no release has (its install fails; the cell records the failure).
IMPOSSIBLE = {"transformers": "0.0.1"}


def uv_or_skip() -> None:
    try:
        deps.uv()
    except RuntimeError as error:
        pytest.skip(f"the venv environment builds virtualenvs with uv, which is not installed: {error}")


@pytest.fixture(scope="module")
def in_oldest(tmp_path_factory, engine_copy) -> tuple[Path, Path, subprocess.CompletedProcess]:
    uv_or_skip()
    work = tmp_path_factory.mktemp("venv")
    impossible = yaml.safe_load((REPO / DEPS).read_text())
    impossible["combinations"] = {"impossible": IMPOSSIBLE}
    impossible["reference"] = "impossible"
    (work / "impossible.yaml").write_text(yaml.safe_dump(impossible))

    def change(matrix: dict) -> None:
        in_venv(matrix)
        matrix.update(environment="venv", deps={"file": DEPS, "combination": COMBINATION})
        del (
            matrix["models"]["qwen2"]["warm_start"],
            matrix["models"]["qwen2_5_vl"],
            matrix["datasets"]["count_shapes"],
        )
        matrix["datasets"]["arithmetic"]["synthetic"].update(train=16, test=8)
        matrix["algorithms"]["gspo"]["trainer.save_freq"] = 2
        matrix["grid"][0]["environment"] = "native"
        matrix["grid"].append(
            {
                **matrix["grid"][0],
                "seeds": [2],
                "environment": "venv",
                "deps": {"file": str(work / "impossible.yaml"), "combination": "impossible"},
            }
        )

    matrix = write_matrix(work / "matrix.yaml", change, TINY)
    return work, matrix, snakemake(work, matrix, engine=engine_copy)


def results(work: Path) -> dict[str, dict[str, str]]:
    with (work / "runs" / "results.csv").open() as f:
        return {row["cell"]: row for row in csv.DictReader(f)}


def hash_of(work: Path, cell: str, environment: str) -> str:
    """A cell's hash computed here from the config it ran (cell.yaml) and its environment key."""
    config = yaml.safe_load((work / "runs" / cell / "cell.yaml").read_text())
    return hashlib.sha256(
        json.dumps({"config": config, "environment": environment}, sort_keys=True).encode()
    ).hexdigest()[:12]


def test_a_cell_in_a_combination_reports_its_versions(in_oldest, engine_copy):
    work, _, result = in_oldest
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    pins = yaml.safe_load((REPO / DEPS).read_text())["combinations"][COMBINATION]
    key = combination_key()
    python = deps.cache_root() / key / "bin" / "python"
    rows = results(work)

    venv = rows["qwen2-gspo-arithmetic-amp"]
    assert venv["status"] == "ok" and venv["environment"] == f"venv {COMBINATION}" and venv["image"] == ""
    versions = dict(item.split("=", 1) for item in venv["versions"].split())
    assert versions["transformers"] == pins["transformers"] and versions["peft"] == pins["peft"]
    assert venv["merged"] == "ok"
    for log in (
        "runs/prepared/logs/model-qwen2.log",
        "runs/prepared/logs/data-arithmetic-d1-16-8-s0.log",
        "runs/qwen2-gspo-arithmetic-amp/train.log",
        "runs/qwen2-gspo-arithmetic-amp/merge.log",
    ):
        assert f"$ env PYTHONPATH={engine_copy} {python} -m easyr1.cli " in (work / log).read_text(), log
    assert (
        json.loads((work / f"runs/prepared/venv/{COMBINATION}-{key}.json").read_text())["versions"][
            "transformers"
        ]
        == (pins["transformers"])
    )

    native = rows["qwen2-grpo-arithmetic-amp"]
    assert native["status"] == "ok" and native["environment"] == "native"
    assert f"transformers={importlib.metadata.version('transformers')}" in native["versions"].split()
    assert "$ env " not in (work / "runs/qwen2-grpo-arithmetic-amp/train.log").read_text()

    # A native cell's hash is what it always was (the records of earlier runs are compared by it);
    # a venv cell's knows its combination and what the combination installs.
    assert native["config_hash"] == hash_of(work, "qwen2-grpo-arithmetic-amp", "native")
    assert venv["config_hash"] == hash_of(work, "qwen2-gspo-arithmetic-amp", f"venv {COMBINATION} {key}")

    provenance = markdown_table((work / "assets" / "baselines.md").read_text(), "Provenance")
    assert {f"venv {COMBINATION}", "native"} <= {row["Environment"] for row in provenance}


def test_a_combination_that_cannot_install_fails_its_cells_and_is_tried_again(in_oldest, engine_copy):
    work, matrix, _ = in_oldest
    failed = results(work)["qwen2-grpo-arithmetic-amp-seed2"]
    assert (
        failed["status"] == "failed"
        and failed["environment"] == "venv impossible"
        and failed["versions"] == ""
    )
    assert (
        "qwen2-grpo-arithmetic-amp-seed2 runs in venv impossible, but its virtualenv did not install"
        in (failed["error_tail"])
    )
    again = snakemake(
        work, matrix, "-n", engine=engine_copy
    )  # only the failed install and its cell run again
    assert {m.group(1) for m in re.finditer(r"wildcards: combination=(\S+),", again.stdout)} == {"impossible"}
    assert {m.group(1) for m in re.finditer(r"wildcards: cell=(\S+)", again.stdout)} == {
        "qwen2-grpo-arithmetic-amp-seed2"
    }
