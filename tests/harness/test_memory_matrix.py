"""The hardware workflow (rules/memory.smk, configs/matrix/hardware.yaml): EasyR1's table's cells
that fit the GPUs on hand and whole-GPU cells, each `easyr1 bench` under a memory cap, with the page
regenerated from their records. The GPU cells run on GPU machines; here the same rules run the
smoke workload (a tiny model on a CPU rank, where the cap is not enforced) for real."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "matrix" / "hardware.yaml"


def memory_workflow(workdir: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "rules" / "memory.smk"),
        "-d",
        str(workdir),
        "--configfile",
        str(config),
        "--profile",
        str(REPO / "configs" / "profiles" / "local"),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def planned_cells(result: subprocess.CompletedProcess) -> set[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return set(re.findall(r"wildcards: cell=(\S+)", result.stdout + result.stderr))


def test_one_gpu_plans_the_tables_one_gpu_cells_and_the_whole_gpu_ones(tmp_path: Path) -> None:
    # Beside an up-to-date page, as in a checkout (the committed page and records): Snakemake remakes
    # no missing input of an up-to-date output, so the default target must name the cells themselves.
    page = tmp_path / "assets" / "hardware.md"
    page.parent.mkdir()
    page.write_text("the committed page\n")
    result = memory_workflow(tmp_path, CONFIG, "-n")
    cells = planned_cells(result)
    table = {"1.5b-bf16-1x24g", "3b-bf16-1x40g", "1.5b-lora-1x12g", "3b-lora-1x24g"}
    # The table's other eleven cells as simulated ranks: rank 0 of their GPUs on the one GPU.
    simulated = {
        f"{cell}-simulated"
        for cell in (
            "1.5b-amp-2x24g",
            "3b-amp-4x40g",
            "7b-amp-8x40g",
            "32b-amp-16x80g",
            "72b-amp-32x80g",
            "7b-bf16-4x40g",
            "32b-bf16-8x80g",
            "72b-bf16-16x80g",
            "7b-lora-2x32g",
            "32b-lora-2x80g",
            "72b-lora-4x80g",
        )
    }
    whole = {
        f"{size}-{precision}-whole{variant}"
        for size in ("1.5b", "3b", "7b")
        for precision in ("bf16", "amp", "lora")
        for variant in ("", "-no-offload", "-padded", "-no-gc")
    }
    assert cells == table | simulated | whole
    # Their models are folders without weights (a 72B one would not fit the GPU that builds it).
    assert set(re.findall(r"output: runs/prepared/model/(qwen2-\S+-config)", result.stdout)) == {
        f"qwen2-{size}-config" for size in ("1.5b", "3b", "7b", "32b", "72b")
    }


def test_a_simulated_cell_is_rank_0_of_its_gpus_on_one_gpu() -> None:
    sys.path.insert(0, str(REPO))
    from rules.scripts.memory_cells import expand_cells

    config = yaml.safe_load(CONFIG.read_text())
    cell = expand_cells(config)["72b-amp-32x80g-simulated"]
    args = cell["args"]
    assert args[args.index("--gpus") + 1] == "1" and args[args.index("--simulated-ranks") + 1] == "32"
    assert args[args.index("--gpu-memory") + 1] == "80" and args[args.index("--backend") + 1] == "hf"
    assert cell["gpu"] == 1 and cell["model"] == "runs/prepared/model/qwen2-72b-config"
    assert not any(name.endswith("-simulated") for name in expand_cells({**config, "simulated_ranks": False}))
    # With the GPUs on hand a cell runs for real, and is not simulated too.
    eight = expand_cells({**config, "table_gpus": 8})
    assert (
        "7b-amp-8x40g" in eight
        and "7b-amp-8x40g-simulated" not in eight
        and "32b-amp-16x80g-simulated" in eight
    )


def test_a_variant_is_easyr1s_example_with_its_overrides_last() -> None:
    sys.path.insert(0, str(REPO))
    from rules.scripts.memory_cells import expand_cells

    cells = expand_cells(yaml.safe_load(CONFIG.read_text()))
    base, padded = cells["3b-amp-whole"]["args"], cells["3b-amp-whole-padded"]["args"]
    assert padded[: base.index("--notes") + 1] == base[: base.index("--notes") + 1]
    assert padded[-1] == "worker.actor.padding_free=false" and padded[base.index("--notes") + 1].endswith(
        ", padded"
    )


def test_a_variant_override_that_is_not_key_value_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    config = yaml.safe_load(CONFIG.read_text())
    config["whole_gpu"]["variants"] = {"padded": ["padding_free false"]}
    bad.write_text(yaml.safe_dump(config))
    result = memory_workflow(tmp_path, bad, "-n")
    assert result.returncode != 0 and "'padding_free false' does not match" in result.stdout + result.stderr


def test_more_gpus_plan_the_tables_multi_gpu_cells(tmp_path: Path) -> None:
    cells = planned_cells(memory_workflow(tmp_path, CONFIG, "-n", "--config", "table_gpus=8"))
    assert {
        "1.5b-amp-2x24g",
        "3b-amp-4x40g",
        "7b-amp-8x40g",
        "7b-bf16-4x40g",
        "32b-bf16-8x80g",
        "72b-lora-4x80g",
    } <= cells
    # 32B AMP and 72B need more than 8: simulated ranks
    assert all(cell.endswith("-simulated") for cell in cells if re.search(r"-(16|32)x", cell))
    assert {"32b-amp-16x80g-simulated", "72b-amp-32x80g-simulated", "72b-bf16-16x80g-simulated"} <= cells


def test_a_bad_config_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {**yaml.safe_load(CONFIG.read_text()), "whole_gpu": {"sizes": ["9b"], "precisions": ["bf16"]}}
        )
    )
    result = memory_workflow(tmp_path, bad, "-n")
    assert result.returncode != 0 and "'9b' is not one of" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda c: c["whole_gpu"]["variants"].update(typo=["worker.actor.offload.offload_paramz=false"]),
            "whole_gpu.variants.typo: unknown config key 'worker.actor.offload.offload_paramz'; did you mean "
            "worker.actor.offload.offload_params?",
        ),
        (
            lambda c: c["whole_gpu"]["variants"].update(badval=["worker.actor.padding_free=maybe"]),
            "whole_gpu.variants.badval: worker.actor.padding_free: expected true or false, got 'maybe'",
        ),
        (
            lambda c: c["whole_gpu"]["precisions"].append("fp32"),
            "whole_gpu.precisions: fp32 is for the tiny size only",
        ),
        (
            lambda c: c["whole_gpu"]["variants"].update(two=["data.rollout_batch_size=2"]),
            None,
        ),  # fits the workload
        (
            lambda c: c.update(recorded=["baselines/gpu/memory/*/*.jsn"]),
            "recorded[0]: 'baselines/gpu/memory/*/*.jsn' matches no file",
        ),
    ],
    ids=[
        "variant-key-typo",
        "variant-value-type",
        "fp32-at-a-real-size",
        "valid-variant",
        "recorded-matches-nothing",
    ],
)
def test_what_a_gpu_job_would_refuse_stops_the_workflow_first(change, message, tmp_path: Path) -> None:
    config = yaml.safe_load(CONFIG.read_text())
    change(config)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    result = memory_workflow(tmp_path, tmp_path / "bad.yaml", "-n")
    if message is None:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode != 0 and f"hardware config: {message}" in result.stdout + result.stderr


def test_a_cell_runs_and_the_page_is_regenerated(tmp_path: Path) -> None:
    config = tmp_path / "smoke.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "table_gpus": 0,
                "whole_gpu": {"sizes": ["tiny"], "precisions": ["fp32"]},
                "steps": 1,
                "resources": {"mem_mb": 4000, "runtime": 10},
                "recorded": ["baselines/gpu/memory/*/*.json"],
            }
        )
    )
    work = tmp_path / "work"
    result = memory_workflow(work, config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((work / "runs/memory/tiny-fp32-whole.json").read_text())
    assert record["workload"] == "smoke_memory" and record["fits"] and record["steps"] == 1
    assert record["notes"] == "rules/memory.smk: tiny fp32 on 1 GPU(s) whole"
    page = (work / "assets/hardware.md").read_text()
    committed = sorted(p.name for p in (REPO / "baselines/gpu/memory").glob("*/*.json"))
    assert committed and all(name in page for name in committed)  # the committed records beside this run's
    assert (work / "assets/hardware/predicted-vs-measured.png").stat().st_size > 0
