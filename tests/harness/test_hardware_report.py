"""assets/hardware.md from the committed memory records: every cell of EasyR1's table, the
measured cells of one and two GPUs, and the estimator within its ±10% of every measured phase peak."""

from __future__ import annotations

import re
from glob import glob
from pathlib import Path

import pytest

from reports.hardware import EASYR1_TABLE, TOLERANCE, write_hardware
from reports.hardware_records import REPO

RECORDS = sorted(glob(str(REPO / "baselines/gpu/memory/*/*.json")))
# Measured phases the estimator misses by more than TOLERANCE, each with what is known of it; the page
# names the largest error whatever this says. An entry whose error comes back within the target fails
# the test, so the list only holds what is still wrong.
KNOWN_MISSES = {
    # The bench records (baselines/gpu/*.json): the page names each configuration's record farthest
    # from its prediction.
    **{
        (name, phase): (
            "vLLM's default model runner (at tensor-parallel size 2 the engine's choice today; on one GPU "
            "before 2026-12-04) holds less of its gpu_memory_utilization share in PyTorch's allocator than "
            "the V2 runner, which holds all of it (0.02 GiB short on every V2 record): 2.65 GiB less on one "
            "H200 (+8.8% there, within the target), 3.1-3.2 on two, 7.4 with 16k-token sequences (max_model_len 16,640), measured as the "
            "advantage phase's allocated peak less the resident models; the estimator counts the whole "
            "share, on the safe side, until what vLLM subtracts (its profiling run's peak, presumably) is "
            "modelled (issue 55, deliverable 4)"
        )
        for name, phase in (
            ("2026-12-04-h200x2-anchor-vllm-tp2.json", "rollout"),
            ("2026-12-04-h200x2-anchor-vllm-tp2.json", "experience"),
            ("2026-12-04-h200x2-long_16k-vllm-ulysses1.json", "rollout"),
            ("2026-12-04-h200x2-long_16k-vllm-ulysses1.json", "experience"),
        )
    },
    ("h200-varied-pf-on.json", "update_actor"): (
        "37.7 GiB predicted, 30.2 measured: the estimator sizes every micro-batch at the length limits "
        "(1,024-token prompts, the planner's worst case), and these prompts are 64 to 1,024 tokens, 544 "
        "on average, which padding-free packs as they are (the padded run of the same prompts: +8.7%) "
        "(issue 55, deliverable 4)"
    ),
    **{
        (name, "update_actor"): (
            "the VL anchor's update on two GPUs (Qwen2.5-VL-3B, vLLM at tensor-parallel size 2 with its "
            "default runner, above, 3.1-3.2 GiB short of its share there) is over-predicted by 11-15%; on "
            "one GPU the same update is within 4-7%. What else the two-GPU records hold less of is not "
            "yet checked (issue 55, deliverable 4)"
        )
        for name in (
            "2026-12-04-h200x2-anchor_vl-vllm-tp2-ulysses1.json",
            "2026-12-04-h200x2-anchor_vl-vllm-tp2-ulysses2.json",
            "2026-12-04-h200x2-anchor_vl-vllm-tp2.json",
        )
    },
}


def test_page_covers_every_cell_and_checks_the_estimator(tmp_path: Path) -> None:
    page, plot = tmp_path / "hardware.md", tmp_path / "hardware" / "plot.png"
    write_hardware(RECORDS, page, plot)
    text = page.read_text()
    cells = [line for line in text.splitlines() if line.startswith("| GRPO ")]
    assert len(cells) == sum(len(row) for row in EASYR1_TABLE.values()) == 15
    # the one-GPU cells that were run carry their measured verdicts, a run out of memory its phase
    measured = [line for line in cells if "h200-" in line]
    assert sum("| BF16 |" in line and "| fits, " in line for line in measured) == 3  # 1*, 2*, 4* (simulated)
    assert sum(" | 1*" in line and "| fits, " in line for line in measured) == 4
    assert "out of memory (update_actor)" in text
    assert all(
        "needs" in line for line in cells if "not measured" in line and "1*" not in line.split(" | ")[3]
    )
    rows = re.findall(
        r"^\| ([^|,]+\.json)[^|]* \|.*\| (\w+) \| [\d.]+ \| [\d.]+ \| ([+-]\d+\.\d)% \|$", text, re.M
    )
    errors = {(record, phase): float(e) / 100 for record, phase, e in rows}
    assert len(errors) >= 12
    assert {key: e for key, e in errors.items() if abs(e) > TOLERANCE and key not in KNOWN_MISSES} == {}
    assert {key: errors.get(key) for key in KNOWN_MISSES if abs(errors.get(key, 0.0)) <= TOLERANCE} == {}
    assert plot.read_bytes()[:4] == b"\x89PNG"
    first = page.read_bytes(), plot.read_bytes()
    write_hardware(RECORDS, page, plot)
    assert (page.read_bytes(), plot.read_bytes()) == first  # the same records give the same bytes


def test_committed_page_is_current(tmp_path: Path) -> None:
    """assets/hardware.md is what the records and the estimator give now (make baselines writes it)."""
    write_hardware(RECORDS, tmp_path / "hardware.md", tmp_path / "plot.png")
    assert (tmp_path / "hardware.md").read_text() == (REPO / "assets/hardware.md").read_text()
    # A bench record's plan is described in words, its partial blocks too.
    assert (
        "8 of 28 decoder blocks recomputed, 20 their attention only" in (tmp_path / "hardware.md").read_text()
    )


def test_a_variant_is_set_beside_its_base_and_kept_out_of_easyr1s_cells(tmp_path: Path) -> None:
    """A whole-GPU run with a setting changed (``whole_gpu.variants``) gets a row in the features table,
    against the same size and precision as EasyR1's example has it, and is not a verdict on EasyR1's cell."""
    import json

    base = [p for p in RECORDS if p.endswith("h200-1.5b-amp.json")][
        -1
    ]  # the latest: the one a variant is set beside
    record = json.loads(Path(base).read_text())
    phases = {k: dict(v, allocated=v["allocated"] - 5.0) for k, v in record["memory_phases"].items()}
    # A combination no committed record has (the latest record of a cell replaces the earlier ones).
    changed = ["worker.actor.padding_free=false", "worker.actor.model.enable_gradient_checkpointing=false"]
    variant = dict(
        record, overrides=changed, memory_phases=phases, step_s=record["step_s"] * 1.5, gpu_memory_gib=None
    )
    path = tmp_path / "synthetic-1.5b-amp-padded.json"
    path.write_text(json.dumps(variant))
    page = tmp_path / "hardware.md"
    write_hardware([*RECORDS, str(path)], page, tmp_path / "plot.png")
    text = page.read_text()
    features = text.split("## What each feature saves")[1].split("## Records")[0]
    row = next(line for line in features.splitlines() if "synthetic-1.5b-amp-padded.json" in line)
    assert (
        "`worker.actor.padding_free=false`, `worker.actor." in row
        and "| -5.0 |" in row
        and "| 1.50x |" in row
    )
    cells = [line for line in text.splitlines() if line.startswith("| GRPO ")]
    assert not any("padded" in line for line in cells)


def test_a_cell_measured_again_is_shown_by_its_latest_record(tmp_path: Path) -> None:
    import json

    base = [p for p in RECORDS if p.endswith("h200-1.5b-amp.json")][-1]
    later = tmp_path / "9999-01-01" / "h200-1.5b-amp-again.json"
    later.parent.mkdir()
    later.write_text(json.dumps(dict(json.loads(Path(base).read_text()), date="9999-01-01T00:00:00+00:00")))
    page = tmp_path / "hardware.md"
    write_hardware([str(later), *RECORDS], page, tmp_path / "plot.png")  # the order given does not matter
    text = page.read_text()
    assert "h200-1.5b-amp-again.json" in text and f"| {Path(base).name} |" not in text


def test_records_from_before_the_compiled_scoring_head_are_set_against_the_eager_head(tmp_path: Path) -> None:
    """The engine compiles the scoring head's chunk work on GPUs since COMPILED_SCORING_SINCE, which
    frees most of its buffers; a record made before is set against the head it ran, and says so."""
    import json

    from reports.hardware_records import COMPILED_SCORING_SINCE, Measured

    base = [p for p in RECORDS if p.endswith("2026-12-02/h200-1.5b-bf16.json")][0]
    record = json.loads(Path(base).read_text())
    assert record["date"] < COMPILED_SCORING_SINCE and not Measured(base, record).compiled_scoring
    later = tmp_path / "h200-1.5b-bf16-later.json"
    # Another cell (an override that changes nothing), so that it does not replace the record.
    later.write_text(
        json.dumps(
            dict(record, date="9999-01-01T00:00:00+00:00", overrides=["worker.actor.padding_free=true"])
        )
    )
    page = tmp_path / "hardware.md"
    # Without 2026-12-04's one-GPU LoRA record, 2026-12-01's (eager head) is its cell's latest.
    records = [p for p in RECORDS if not p.endswith("2026-12-04/h200-1.5b-lora-12g.json")]
    write_hardware([*records, str(later)], page, tmp_path / "plot.png")
    text = page.read_text()

    def experience(name: str) -> str:
        return next(
            line for line in text.splitlines() if line.startswith(f"| {name} |") and "| experience |" in line
        )

    # Measured 4.63 GiB both times: the eager head's 4.05 chunks predicted it; the compiled head's
    # 0.54 chunk does not (that record's engine was not the one the later date claims).
    assert "| 4.63 | 4.64 | +0.3% |" in experience("h200-1.5b-bf16.json")
    assert "| 4.63 | 1.14 |" in experience("h200-1.5b-bf16-later.json")
    lora = next(line for line in text.splitlines() if line.startswith("| GRPO LoRA") and "| 1.5B |" in line)
    assert "(h200-1.5b-lora-12g.json, before the compiled scoring head)" in lora


def test_simulated_ranks_give_a_cell_its_verdict_and_never_replace_a_real_run(tmp_path: Path) -> None:
    """A record of simulated ranks (rank 0 of the cell's GPUs on one GPU) is the verdict of a cell no
    real run measured, marked as such; beside a real run of the same cell both records stay, and the
    real GPUs give the cell's verdict."""
    import json

    from easyr1.memory import NCCL_GIB

    real = [p for p in RECORDS if p.endswith("h200-1.5b-amp-2x24g.json")][-1]
    record = json.loads(Path(real).read_text())
    later = dict(record, date="9999-01-01T00:00:00+00:00", simulated_ranks=2)
    four = dict(later, workload="easyr1_3b", gpus=4, gpu_memory_gib=40.0, simulated_ranks=4)
    paths = {name: tmp_path / f"{name}.json" for name in ("sim-1.5b-amp-2x24g", "sim-3b-amp-4x40g")}
    paths["sim-1.5b-amp-2x24g"].write_text(json.dumps(later))
    paths["sim-3b-amp-4x40g"].write_text(json.dumps(four))
    page = tmp_path / "hardware.md"
    write_hardware([*RECORDS, *map(str, paths.values())], page, tmp_path / "plot.png")
    text = page.read_text()
    cells = {
        line.split(" | ")[2] + " " + line.split(" | ")[3]: line
        for line in text.splitlines()
        if line.startswith("| GRPO Full Fine-Tuning | AMP ")
    }
    assert (
        "(sim-3b-amp-4x40g.json, simulated ranks)" in cells["3B 4*40GB"] and "| fits, " in cells["3B 4*40GB"]
    )
    assert f"({Path(real).name})" in cells["1.5B 2*24GB"]  # the real run's, though the simulated one is newer
    # A simulated rank had no NCCL communicators: their share is added to what it needed.
    from reports.hardware_records import Measured

    assert Measured("x", later).needed == Measured("x", record).needed + NCCL_GIB
    checks = text.split("## The estimator against the measurements")[1]
    assert f"| {Path(real).name} |" in checks and "| sim-1.5b-amp-2x24g.json, simulated ranks |" in checks


def test_a_whole_smaller_gpu_measures_a_cell_only_where_the_run_fit(tmp_path: Path) -> None:
    """An 80 GB cell run on a whole H100 (79.2 GiB: a cap above the device is refused) is the cell's
    verdict when it fit with room for NCCL within 80 GiB, said so; a run that failed there is not."""
    import json

    sim = [p for p in RECORDS if p.endswith("h200-7b-bf16-4x40g-simulated.json")][-1]
    h100 = dict(
        json.loads(Path(sim).read_text()),
        workload="easyr1_32b",
        gpus=8,
        simulated_ranks=8,
        gpu_memory_gib=None,
        gpu="NVIDIA H100 80GB HBM3",
        gpu_total_gib=79.18,
    )
    fit, failed = (
        tmp_path / "h100-32b-bf16-8x80g-simulated.json",
        tmp_path / "h100-72b-bf16-16x80g-simulated.json",
    )
    fit.write_text(json.dumps(h100))
    oom = {"phase": "update_actor", "max_allocated_gib": 77.0}
    failed.write_text(json.dumps(dict(h100, workload="easyr1_72b", gpus=16, simulated_ranks=16, oom=oom)))
    page = tmp_path / "hardware.md"
    write_hardware([*RECORDS, str(fit), str(failed)], page, tmp_path / "plot.png")
    rows = {
        line.split(" | ")[2]: line
        for line in page.read_text().splitlines()
        if line.startswith("| GRPO Full Fine-Tuning | BF16 ")
    }
    assert (
        "fits, " in rows["32B"] and f"({fit.name}, simulated ranks, on a whole 79.2 GiB GPU)" in rows["32B"]
    )
    assert "not measured" in rows["72B"]


def test_records_of_other_workloads_check_the_estimator_but_are_no_cell_of_easyr1s_table(
    tmp_path: Path,
) -> None:
    """A memory record of another workload (the LoRA anchor's micro-batches of 49,152 tokens) is a case
    of the estimator's check table, named with its workload, and never a verdict on EasyR1's cells."""
    page = tmp_path / "hardware.md"
    write_hardware(RECORDS, page, tmp_path / "plot.png")
    text = page.read_text()
    checks = text.split("## The estimator against the measurements")[1].split("## What each feature saves")[0]
    assert "| h200-anchor-lora-gc.json | anchor 1.5B | bf16 |" in checks
    assert "update_actor" in next(
        line for line in checks.splitlines() if "anchor-lora-gc.json" in line and "update" in line
    )
    cells = [line for line in text.splitlines() if line.startswith("| GRPO ")]
    assert not any("anchor" in line for line in cells)


def test_no_phase_that_ran_out_of_memory_is_predicted_below_where_it_failed() -> None:
    """For every record that ran out of memory, the estimator predicts the failed phase at least at
    what PyTorch had allocated when it failed: `auto` plans on these predictions, so one below a
    failure would plan that failure again (the LoRA anchor's, issue 55)."""
    import json

    from reports.hardware_records import PHASES, load_records, predict

    failed = [m for m in load_records(RECORDS) if m.record.get("oom")]
    assert any("anchor-lora-no-gc" in m.name for m in failed)
    phase_of = {key: phase for phase, key in PHASES.items()}
    for m in failed:
        oom = m.record["oom"]
        _, predicted = predict(m)
        phase = phase_of.get(oom["phase"], oom["phase"])
        assert predicted[phase] >= oom["max_allocated_gib"], (m.name, json.dumps(oom)[:200])


def test_every_bench_record_is_a_case_or_left_out_with_its_reason() -> None:
    """The GPU bench records are estimator cases beside the memory records: none is dropped silently,
    and those that cannot be one (no memory per phase) are counted with why."""
    from reports.hardware_records import bench_groups, bench_paths, load_bench_records

    paths = bench_paths()
    cases, left = load_bench_records(paths)
    assert len(cases) + sum(len(names) for names in left.values()) == len(paths) >= 120
    assert len(cases) >= 100 and list(left) == [
        "made before the bench recorded memory phase by phase (2026-12-02)"
    ]
    workloads = {m.record["workload"] for m in cases}
    assert {"anchor", "anchor_vl", "anchor_video", "long_16k", "anchor_varied"} <= workloads
    assert len(bench_groups(cases)) < len(cases) / 3  # repeats are one configuration


def test_a_sleeping_vllm_pool_is_counted_as_pytorch_counts_it() -> None:
    """vLLM's pool is unmapped while it sleeps but stays allocated in PyTorch's counters
    (``max_memory_allocated``), so a record where it slept is set against the prediction plus vLLM's
    share in every phase after the rollout; an older record that does not say whether it slept shows
    it by an allocated peak above what the device held."""
    import json

    from reports.hardware_records import Measured, predict

    video = REPO / "baselines/gpu/2026-12-02-h200-anchor_video-vllm.json"
    awake = REPO / "baselines/gpu/2026-12-04-h200-anchor-vllm-e.json"
    slept = Measured(str(video), json.loads(video.read_text()), bench=True)
    assert "vllm_awake" not in slept.record and slept.vllm_slept
    assert not Measured(str(awake), json.loads(awake.read_text()), bench=True).vllm_slept
    estimate, phases = predict(slept)
    share = slept.config().worker.rollout.gpu_memory_utilization * slept.size_gib
    assert "vLLM (weights, KV cache; gpu_memory_utilization)" not in estimate.phases["experience"]
    assert phases["experience"] == pytest.approx(estimate.phase_total("experience") / 2**30 + share)
    assert (
        abs(phases["experience"] / slept.record["memory_phases"]["ref_log_prob"]["allocated"] - 1) < TOLERANCE
    )
