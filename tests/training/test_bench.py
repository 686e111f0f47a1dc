"""`easyr1 bench` and its TRL peer (`bench/trl_peer.py`): the summary's step-time statistics from
fabricated runs (true medians, min/max, the ratio), the peer's settings without trl, the summary
kept when the peer fails, and both benchmarks end to end on CPU (the smoke workload; the peer on
smoke_vl too)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

from easyr1 import bench, bench_peer, workloads
from easyr1.bench import summarize
from easyr1.bench_peer import step_stats, with_trl
from easyr1.config import override_value
from easyr1.provenance import cpu_model
from easyr1.workloads import WORKLOADS

REPO = Path(__file__).resolve().parents[2]
HAS_TRL = importlib.util.find_spec("trl") is not None
needs_trl = pytest.mark.skipif(not HAS_TRL, reason="trl is not installed (pip install -e '.[peer]')")

# Every key of a summary with the peer's figures: what `easyr1 bench --trl` writes.
SUMMARY_KEYS = {
    "workload",
    "backend",
    "gpus",
    "dtype",
    "model",
    "rollouts_per_step",
    "prompt_tokens",
    "response_tokens",
    "steps",
    "step_s",
    "step_s_min",
    "step_s_max",
    "tokens_per_s",
    "mfu_actor",
    "peak_mem_gib",
    "peak_mem_allocated_gib",
    "phases",
    "per_step",
    "date",
    "gpu",
    "cpu",
    "cpus",
    "numa_nodes",
    "gpu_numa_node",
    "torch",
    "transformers",
    "vllm",
    "python",
    "git_revision",
    "engine",
    "vllm_env",
    "overrides",
    "notes",
    "precision",
    "gpu_memory_gib",
    "fits",
    "oom",
    "peak_held_gib",
    "peak_needed_gib",
    "gpu_other_memory_gib",
    "memory_phases",
    "gpu_total_gib",
    "vllm_awake",
    "recomputed_blocks",
    "allocator_env",
}
SHAPE_KEYS = {"rollouts_per_step", "prompt_tokens", "response_tokens"}  # from the run's resolved config
TRL_KEYS = {"trl_step_s", "trl_step_s_min", "trl_step_s_max", "trl_tokens_per_s", "speedup_vs_trl", "trl"}


def _peer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trl_peer", REPO / "bench" / "trl_peer.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _metrics(path: Path, times: list[float]) -> Path:
    """A metrics.jsonl as the trainer writes it: a step-0 validation line, then one line per step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"step": 0, "val/reward_score": 0.0}]
    lines += [
        {
            "step": i + 1,
            "perf/time_per_step": t,
            "perf/throughput": 1000.0 / t,
            "timing_s/gen": t / 2,
            "perf/gpu_busy_s/gen": t / 4,
            "rollout/handover_s": t / 10,
            "actor/pg_loss": 0.0,
            "actor/lr": 1e-6,
        }
        for i, t in enumerate(times)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_step_stats_leave_out_the_first_step_and_take_the_true_median() -> None:
    # Steps 2..5 are an even count: the median is the mean of the two middle values, 2.5, where
    # sorted(times)[len // 2] (the old peer's figure) would say 3.
    assert step_stats([9.0, 4.0, 1.0, 3.0, 2.0]) == {"median": 2.5, "min": 1.0, "max": 4.0}
    assert step_stats([9.0, 4.0, 1.0, 3.0]) == {"median": 3.0, "min": 1.0, "max": 4.0}
    assert step_stats([7.0]) == {"median": 7.0, "min": 7.0, "max": 7.0}  # a single step counts as is
    assert step_stats([]) == {"median": None, "min": None, "max": None}


def test_summary_and_peer_statistics_from_fabricated_runs(tmp_path: Path) -> None:
    summary = summarize(_metrics(tmp_path / "metrics.jsonl", [10.0, 4.0, 1.0, 3.0, 2.0]), "anchor", "vllm", 1)
    assert summary["steps"] == 5 and len(summary["per_step"]) == 5
    # Each step keeps its time, phases with the GPU's busy time in them, rollout figures (the
    # hand-over) and training figures, not every metric the trainer logs.
    assert summary["per_step"][2] == {
        "step": 3,
        "perf/time_per_step": 1.0,
        "perf/throughput": 1000.0,
        "timing_s/gen": 0.5,
        "perf/gpu_busy_s/gen": 0.25,
        "rollout/handover_s": 0.1,
        "actor/pg_loss": 0.0,
    }
    assert (summary["step_s"], summary["step_s_min"], summary["step_s_max"]) == (2.5, 1.0, 4.0)
    assert summary["phases"]["timing_s/gen"] == 1.25
    assert summary["phases"]["perf/gpu_busy_s/gen"] == 0.625

    anchor = WORKLOADS["anchor"]
    peer = _peer().figures(anchor, [20.0, 8.0, 5.0, 6.0, 7.0], [512.0, 512.0])
    assert (peer["step_s"], peer["step_s_min"], peer["step_s_max"]) == (6.5, 5.0, 8.0)
    assert peer["tokens_per_step"] == 64 * 768 and peer["tokens_per_s"] == pytest.approx(49152 / 6.5)
    assert peer["step_times"] == [20.0, 8.0, 5.0, 6.0, 7.0] and peer["completion_tokens_min"] == 512

    both = with_trl(summary, peer)
    assert (both["trl_step_s"], both["trl_step_s_min"], both["trl_step_s_max"]) == (6.5, 5.0, 8.0)
    assert both["speedup_vs_trl"] == pytest.approx(6.5 / 2.5)  # the two true medians, TRL's over ours
    assert both["trl_tokens_per_s"] == pytest.approx(49152 / 6.5) and both["trl"] is peer
    assert set(both) == (SUMMARY_KEYS - SHAPE_KEYS - {"overrides", "notes"}) | TRL_KEYS


def test_peer_settings_need_no_trl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "trl", None)  # any `import trl` now fails
    peer = _peer()
    ns = peer.parse_args(["--workload", "anchor", "--model", "m", "--prompts", "p.jsonl", "--out", "o.json"])
    assert ns.steps == 5 and ns.model == Path("m")
    assert peer.PEER_WORKLOADS == ["anchor", "anchor_vl", "long_16k", "smoke", "smoke_vl"]
    with pytest.raises(SystemExit):  # TRL's peer runs text and image workloads, not video
        peer.parse_args(
            ["--workload", "anchor_video", "--model", "m", "--prompts", "p.jsonl", "--out", "o.json"]
        )

    gpu = peer.grpo_settings(WORKLOADS["anchor"], 5, True, tmp_path)
    assert gpu["per_device_train_batch_size"] * gpu["gradient_accumulation_steps"] == 64
    assert gpu["num_generations"] == 8 and gpu["max_completion_length"] == 512
    assert gpu["generation_kwargs"] == {"min_new_tokens": 512}  # EOS never ends a response
    assert gpu["beta"] == 0.01 and gpu["gradient_checkpointing"] and gpu["bf16"] and not gpu["use_cpu"]
    assert gpu["max_steps"] == 5 and not gpu["use_vllm"]
    cpu = peer.grpo_settings(WORKLOADS["smoke"], 2, False, tmp_path)
    assert cpu["per_device_train_batch_size"] * cpu["gradient_accumulation_steps"] == 8
    assert not cpu["bf16"] and cpu["use_cpu"] and cpu["generation_kwargs"] == {"min_new_tokens": 16}


def test_peer_never_samples_the_tokens_ours_forbids(tmp_path: Path, tiny_model: Any) -> None:
    """On an image workload both peers forbid what our rollouts forbid (vision placeholders and
    markers): TRL's vLLM path forbids nothing, and on the H200 a completion holding an image
    placeholder then broke TRL's forward ("Image features and image tokens do not match")."""
    from transformers import AutoConfig

    from easyr1.rollout.hf import forbidden_token_ids

    peer = _peer()
    forbidden = forbidden_token_ids(AutoConfig.from_pretrained(tiny_model("qwen2_5_vl")))
    assert forbidden  # the image and video placeholders, vision start and end
    hf = peer.grpo_settings(WORKLOADS["smoke_vl"], 2, False, tmp_path, forbidden=forbidden)
    assert hf["generation_kwargs"] == {"min_new_tokens": 16, "suppress_tokens": forbidden}
    engine = bench.vllm_engine_kwargs("smoke_vl", "m", gpu_memory_gib=H200_GIB)
    vllm = peer.grpo_settings(WORKLOADS["smoke_vl"], 2, False, tmp_path, engine, forbidden)
    assert vllm["generation_kwargs"]["logit_bias"] == {t: -100.0 for t in forbidden}
    assert json.loads(json.dumps(vllm["generation_kwargs"]))  # the peer's result keeps it as JSON


def test_trl_refused_before_training_for_a_video_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--workload", "smoke_video", "--trl", "--root", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # nothing was built or trained
    assert "takes no videos" in capsys.readouterr().err


@pytest.mark.parametrize("override", ["worker.rollout.n=4", "data.max_response_length=8"])
def test_trl_refused_before_training_when_an_override_reshapes_our_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str
) -> None:
    """The peer runs the workload's own shape: a ratio against our run with more samples or shorter
    responses would compare two different steps. Other overrides pass (the smoke run's micro-batch)."""
    with pytest.raises(SystemExit):
        bench.main(["--workload", "smoke", "--trl", "--root", str(tmp_path), override])
    assert not any(tmp_path.iterdir())  # nothing was built or trained
    assert (
        f"{override.partition('=')[0]} would change our step and not the TRL peer's"
        in capsys.readouterr().err
    )
    other = bench_peer.peer_refusal("hf", "smoke", ["worker.actor.micro_batch_size_per_device_for_update=2"])
    assert "would change our step" not in (other or "")  # None, or that trl is not installed here


def test_peer_prompts_put_the_image_where_ours_does() -> None:
    peer = _peer()
    assert peer.message_content("What is 2 + 3?") == "What is 2 + 3?"
    assert peer.message_content("<image>How many?") == [
        {"type": "image"},
        {"type": "text", "text": "How many?"},
    ]
    assert peer.message_content("Left <image> right") == [
        {"type": "text", "text": "Left "},
        {"type": "image"},
        {"type": "text", "text": " right"},
    ]


def _fake_launch(times: list[float]) -> Any:
    def launch(config: Any, args: list[str]) -> int:
        run_dir = Path(config.trainer.save_checkpoint_path)
        _metrics(run_dir / "metrics.jsonl", times)
        (run_dir / "config.yaml").write_text(config.to_yaml())  # as the trainer writes it
        return 0

    return launch


@needs_trl
def test_bench_hands_its_model_and_prompts_to_the_peer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import easyr1.launch.local

    monkeypatch.setattr(easyr1.launch.local, "launch", _fake_launch([5.0, 2.0, 3.0]))
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    seen: dict[str, Any] = {}

    def run_trl(name: str, steps: int, model: str, prompts: str, out: Path) -> dict[str, Any]:
        seen.update(name=name, steps=steps, model=model, prompts=prompts)
        return {"step_times": [9.0, 6.0, 4.0], "tokens_per_step": 640}

    monkeypatch.setattr(bench_peer, "run_trl", run_trl)
    out = tmp_path / "summary.json"
    argv = [
        "--workload",
        "smoke",
        "--steps",
        "3",
        "--root",
        str(tmp_path),
        "--out",
        str(out),
        "--trl",
        "--notes",
        "why",
    ]
    assert bench.main(argv) == 0
    assert seen == {
        "name": "smoke",
        "steps": 3,
        "model": str(tmp_path / "smoke" / "model"),
        "prompts": str(tmp_path / "smoke" / "train.jsonl"),
    }
    summary = json.loads(out.read_text())
    assert set(summary) == SUMMARY_KEYS | TRL_KEYS and summary["notes"] == "why"
    assert summary["cpu"] == cpu_model() and summary["cpus"] >= 1
    assert summary["numa_nodes"] >= 1 and summary["gpu_numa_node"] is None  # Linux; no GPU here
    assert summary["allocator_env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert summary["step_s"] == 2.5 and summary["trl_step_s"] == 5.0 and summary["speedup_vs_trl"] == 2.0


def test_both_peers_run_after_one_run_of_ours(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--trl-vllm --trl``: our run once, then each peer in the order asked, a record each beside
    the same figures of ours (the second named after its flag). TRL and vLLM are faked: the test
    is of the bench's bookkeeping, and the vLLM peer needs a GPU."""
    import easyr1.launch.local

    monkeypatch.setattr(easyr1.launch.local, "launch", _fake_launch([5.0, 2.0, 3.0]))
    monkeypatch.setattr(bench, "peer_refusal", lambda mode, workload, overrides: None)
    monkeypatch.setenv(
        "VLLM_USE_FLASHINFER_SAMPLER", ""
    )  # so that monkeypatch restores it, then unset: the bench sets it
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # the user's choice, recorded
    ran: list[tuple[str, Path]] = []

    def run_trl(name: str, steps: int, model: str, prompts: str, out: Path, **kwargs: Any) -> dict[str, Any]:
        mode = kwargs.get("mode", "hf")
        ran.append((mode, out))
        return {
            "mode": mode,
            "step_times": [9.0, 6.0, 4.0] if mode == "hf" else [9.0, 4.0, 4.0],
            "tokens_per_step": 640,
        }

    monkeypatch.setattr(bench_peer, "run_trl", run_trl)
    out = tmp_path / "inv1.json"
    argv = [
        "--workload",
        "smoke",
        "--steps",
        "3",
        "--root",
        str(tmp_path),
        "--out",
        str(out),
        "--trl-vllm",
        "--trl",
    ]
    assert bench.main(argv) == 0
    assert ran == [("vllm", tmp_path / "smoke" / "trl_vllm.json"), ("hf", tmp_path / "smoke" / "trl.json")]
    first, second = json.loads(out.read_text()), json.loads((tmp_path / "inv1-trl.json").read_text())
    assert first["trl"]["mode"] == "vllm" and second["trl"]["mode"] == "hf"
    assert first["step_s"] == second["step_s"] == 2.5 and first["per_step"] == second["per_step"]
    assert first["speedup_vs_trl"] == 4.0 / 2.5 and second["speedup_vs_trl"] == 5.0 / 2.5
    # A vLLM peer runs in vLLM's environment as our rollout sets it, and the records say so.
    assert {
        k: first["vllm_env"].get(k) for k in ("VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V2_MODEL_RUNNER")
    } == {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert bench_peer.peer_record_path(out, ["hf"], "hf") == out


@needs_trl
def test_summary_is_kept_when_the_peer_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import easyr1.launch.local

    monkeypatch.setattr(easyr1.launch.local, "launch", _fake_launch([5.0, 2.0]))

    def run_trl(*args: Any) -> dict[str, Any]:
        raise subprocess.CalledProcessError(1, ["trl_peer.py"])

    monkeypatch.setattr(bench_peer, "run_trl", run_trl)
    out = tmp_path / "summary.json"
    with pytest.raises(subprocess.CalledProcessError):
        bench.main(
            ["--workload", "smoke", "--steps", "2", "--root", str(tmp_path), "--out", str(out), "--trl"]
        )
    summary = json.loads(out.read_text())
    assert set(summary) == SUMMARY_KEYS and summary["step_s"] == 2.0


def test_smoke_benchmark_writes_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "easyr1.cli",
            "bench",
            "--workload",
            "smoke",
            "--steps",
            "2",
            "--root",
            str(tmp_path),
            "--out",
            str(out),
            "--profile",
            "worker.actor.micro_batch_size_per_device_for_update=2",
            "data.max_response_length=12",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert set(summary) == SUMMARY_KEYS | {"profile", "host_profile"}
    # --profile: one more step under torch.profiler, each phase's costliest ops. The update's include
    # its backward pass, which runs on autograd's thread: ops belong to the phase they began in.
    profile = summary["profile"]
    assert profile["step"] == 3 and profile["time"] == "cpu"
    update = profile["phases"]["update_actor"]
    assert 0 < update["ops_s"] and update["wall_s"] == pytest.approx(
        summary["per_step"][2]["timing_s/update_actor"], rel=0.2
    )
    # Counts, not times (a loaded host reorders the costliest ops): each linear's backward is two
    # matmuls, so with the backward counted the matmuls outnumber the biased projections' addmm 4 to 1
    # (1.5 to 1 in a forward alone).
    calls = {op["op"]: op["calls"] for op in update["top"]}
    assert calls["aten::mm"] >= 3 * calls["aten::addmm"], update["top"]
    assert {"gen", "reward", "ref_log_prob", "adv", "update_actor"} <= set(profile["phases"])
    # ... and one with the host sampler: where each phase's Python time went, the rollout's generate within gen.
    host = summary["host_profile"]
    assert host["step"] == 4 and {"gen", "update_actor"} <= set(host["phases"])
    assert any(
        f["function"].startswith("easyr1/rollout/") and f["function"].endswith(".generate")
        for f in host["phases"]["gen"]["within"]
    )
    assert sorted(p.name for p in (tmp_path / "smoke" / "run" / "profile").iterdir()) == [
        "step3-rank0.json",
        "step4-rank0-host.json",
    ]
    assert summary["workload"] == "smoke" and summary["backend"] == "hf" and summary["steps"] == 2
    assert summary["rollouts_per_step"] == 8 and summary["step_s"] > 0 and summary["tokens_per_s"] > 0
    assert (summary["prompt_tokens"], summary["response_tokens"]) == (
        64,
        12,
    )  # the override, not the workload's 16
    # One timed step, the profiled ones left out of the figures: it is median, min and max.
    step2 = summary["per_step"][1]["perf/time_per_step"]
    assert summary["step_s"] == summary["step_s_min"] == summary["step_s_max"] == step2
    assert summary["overrides"] == [
        "worker.actor.micro_batch_size_per_device_for_update=2",
        "data.max_response_length=12",
    ]
    resolved = (tmp_path / "smoke" / "run" / "config.yaml").read_text()
    assert "micro_batch_size_per_device_for_update: 2" in resolved
    assert summary["phases"]["timing_s/update_actor"] > 0
    assert "timing_s/old_log_prob" not in summary["phases"]  # one mini-batch, one epoch: on-policy
    assert len(summary["per_step"]) == 4 and summary["git_revision"]
    # enable_gradient_checkpointing=auto (the default) recomputes every block on a CPU: the tiny model's 2.
    assert summary["recomputed_blocks"] == 2


def test_video_benchmark_trains_on_clips(tmp_path: Path) -> None:
    """The video anchor's shape on the tiny VL model: prompts carry one mp4 clip each, the rollout
    is told to expect one video a prompt, and the steps train."""
    out = tmp_path / "video.json"
    assert (
        bench.main(["--workload", "smoke_video", "--steps", "1", "--root", str(tmp_path), "--out", str(out)])
        == 0
    )
    summary = json.loads(out.read_text())
    assert summary["steps"] == 1 and summary["tokens_per_s"] > 0
    resolved = (tmp_path / "smoke_video" / "run" / "config.yaml").read_text()
    assert "limit_videos: 1" in resolved
    rows = pq.read_table(next((tmp_path / "smoke_video" / "data").glob("train*"))).to_pylist()
    assert all(len(row["videos"]) == 1 and row["problem"].startswith("<video>") for row in rows)


@needs_trl
def test_trl_peer_runs_the_smoke_workload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    prepared = bench.prepare("smoke", tmp_path, "cpu")
    peer = bench_peer.run_trl(
        "smoke",
        2,
        prepared["worker.actor.model.model_path"],
        prepared["data.train_files"],
        tmp_path / "trl.json",
    )
    assert peer["peer"] == "trl" and peer["trl"] == "1.16.0" and peer["dtype"] == "fp32"
    assert peer["steps"] == 2 and len(peer["step_times"]) == 2
    assert peer["step_s"] == peer["step_s_min"] == peer["step_s_max"] == peer["step_times"][1]
    # Full-length responses: EOS never ended one early, as `ignore_eos` on our side.
    assert (
        peer["completion_tokens_min"] == peer["completion_tokens_max"] == WORKLOADS["smoke"].response_tokens
    )
    assert peer["tokens_per_step"] == 8 * (64 + 16) and peer["rollouts_per_step"] == 8


@needs_trl
def test_trl_peer_runs_the_image_workload_after_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`easyr1 bench --workload smoke_vl --trl` end to end on CPU: our run, then TRL's GRPOTrainer on
    the same tiny Qwen2.5-VL folder, prompts and images, with our processor (no torchvision here)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    out = tmp_path / "summary.json"
    assert (
        bench.main(
            ["--workload", "smoke_vl", "--steps", "2", "--root", str(tmp_path), "--out", str(out), "--trl"]
        )
        == 0
    )
    summary = json.loads(out.read_text())
    assert set(summary) == SUMMARY_KEYS | TRL_KEYS
    peer = summary["trl"]
    assert peer["workload"] == "smoke_vl" and peer["mode"] == "hf" and peer["dtype"] == "fp32"
    assert peer["steps"] == 2 and summary["trl_step_s"] == peer["step_times"][1] > 0
    assert summary["speedup_vs_trl"] == pytest.approx(summary["trl_step_s"] / summary["step_s"])
    assert (
        peer["completion_tokens_min"]
        == peer["completion_tokens_max"]
        == WORKLOADS["smoke_vl"].response_tokens
    )
    # The same prompts as ours, image tokens included: both runs count the same tokens per step.
    ours = summary["per_step"][1]["perf/throughput"] * summary["per_step"][1]["perf/time_per_step"]
    assert (
        peer["tokens_per_step"] == pytest.approx(ours)
        and peer["prompt_tokens"] < WORKLOADS["smoke_vl"].prompt_tokens
    )
    assert set(_peer().DIFFERS_IMAGES) <= set(peer["differs"])


def test_a_step_counts_the_garbage_collectors_pauses() -> None:
    """``perf/gc_s`` and ``perf/gc_full``: the collector's time within the step, and its full collections."""
    import gc

    from easyr1.telemetry import StepTelemetry

    gc.disable()  # only the collections below, so the counts are exact
    try:
        tele = StepTelemetry(torch.device("cpu"))
        garbage = [[i] for i in range(200_000)]
        for item in garbage:
            item.append(item)  # cycles: only the collector frees them
        del garbage, item
        gc.collect()
        gc.collect(0)
        out = tele.finish(tokens=1, actor_flops=0.0)
        assert out["perf/gc_full"] == 1 and out["perf/gc_s"] > 0
        assert StepTelemetry(torch.device("cpu")).finish(tokens=1, actor_flops=0.0)["perf/gc_full"] == 0
    finally:
        gc.enable()


def test_a_step_counts_what_else_the_machine_did() -> None:
    """``perf/cpu_process_s`` and ``perf/cpu_others_s``: a second process spinning through the step
    is counted as another's CPU time, the step's own loop as this process's. Each is checked against
    the kernel's own account of the same work (this process's CPU clock, the spinner's rusage), not
    against the wall time: on a loaded host neither gets a core for all of it."""
    from easyr1.telemetry import StepTelemetry

    tele = StepTelemetry(torch.device("cpu"))
    own = time.process_time()
    spinner = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"]
    )
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        pass
    _, _, usage = os.wait4(spinner.pid, 0)
    own = time.process_time() - own
    out = tele.finish(tokens=1, actor_flops=0.0)
    spun = usage.ru_utime + usage.ru_stime
    tick = 0.05  # the kernel's CPU accounts tick at 10 ms, per CPU
    assert spun > 0.1 and out["perf/cpu_process_s"] == pytest.approx(own, abs=tick), (out, own, spun)
    assert out["perf/cpu_others_s"] >= spun - tick, (out, spun)
    assert out["perf/cpu_steal_s"] >= 0 and "perf/gpu_power_w" not in out


def test_a_cpu_steps_calibration_is_timed_in_cpu_seconds_and_draws_no_random_number() -> None:
    """``perf/calibration_cpu_s``: the fixed work timed around a step on CPU ranks, in this thread's CPU
    seconds (the harness sets a step's CPU seconds over it); it leaves torch's random state as it was,
    so a run computes the same with it."""
    from easyr1.telemetry import StepTelemetry

    state = torch.get_rng_state()
    out = StepTelemetry(torch.device("cpu")).finish(tokens=1, actor_flops=0.0)
    assert out["perf/calibration_cpu_s"] > 0 and torch.equal(torch.get_rng_state(), state)


def test_a_step_reads_the_gpus_energy_and_throttle_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's counters (a stand-in module: this machine has no GPU): the step's mean power is the
    energy counter's rise over its time, its throttled time the power and thermal violation timers' rise."""
    import types

    from easyr1 import telemetry

    counters = {"energy": 1_000_000, "power": 5_000_000_000, "thermal": 0}

    def violation(handle: object, policy: str) -> object:
        return types.SimpleNamespace(violationTime=counters[policy])

    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetTotalEnergyConsumption=lambda handle: counters["energy"],
        nvmlDeviceGetViolationStatus=violation,
        NVML_PERF_POLICY_POWER="power",
        NVML_PERF_POLICY_THERMAL="thermal",
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid="0-1"))
    telemetry._nvml_handle.cache_clear()
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(telemetry.time, "perf_counter", lambda: next(clock))
    contention = telemetry.Contention(torch.device("cuda", 0))
    assert contention.nvml == "GPU-0-1"
    counters.update(energy=1_000_000 + 1_400_000, power=5_250_000_000, thermal=50_000_000)  # 1400 J in 2 s
    out = contention.finish()
    telemetry._nvml_handle.cache_clear()
    assert out["perf/gpu_power_w"] == pytest.approx(700.0) and out["perf/gpu_throttled_s"] == pytest.approx(
        0.3
    )


class _FakeGpm:
    """NVML's GPU performance monitoring as a stand-in module (this machine has no GPU): the device's
    kernels have run ``active`` seconds in all, and a sample notes that count and the time it was taken,
    on a clock the test advances (``now``), which the telemetry reads too: the readings are exact, on
    any host."""

    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_METRIC_GRAPHICS_UTIL = 1, 1

    class c_nvmlGpmMetricsGet_t:  # noqa: N801 - pynvml's name
        def __init__(self) -> None:
            import types

            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)]

    def __init__(self, supported: bool = True) -> None:
        self.supported, self.active, self.allocated, self.error = supported, 0.0, 0, 0
        self.now = 0.0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import types

        from easyr1 import telemetry

        nvml = types.SimpleNamespace(
            nvmlInit=lambda: None,
            nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
            nvmlDeviceGetTotalEnergyConsumption=lambda handle: 0,
            nvmlDeviceGetViolationStatus=lambda handle, policy: types.SimpleNamespace(violationTime=0),
            NVML_PERF_POLICY_POWER="power",
            NVML_PERF_POLICY_THERMAL="thermal",
            nvmlGpmQueryDeviceSupport=lambda handle: types.SimpleNamespace(
                isSupportedDevice=int(self.supported)
            ),
            nvmlGpmSampleAlloc=self._alloc,
            nvmlGpmSampleGet=lambda handle, sample: sample.update(active=self.active, at=self.now),
            nvmlGpmSampleFree=self._free,
            nvmlGpmMetricsGet=self._metrics,
            c_nvmlGpmMetricsGet_t=self.c_nvmlGpmMetricsGet_t,
            NVML_GPM_METRICS_GET_VERSION=self.NVML_GPM_METRICS_GET_VERSION,
            NVML_GPM_METRIC_GRAPHICS_UTIL=self.NVML_GPM_METRIC_GRAPHICS_UTIL,
        )
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        monkeypatch.setattr(telemetry, "time", types.SimpleNamespace(perf_counter=lambda: self.now))
        monkeypatch.setattr(
            torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid="0-1")
        )
        telemetry._nvml_handle.cache_clear()  # and again after the test
        telemetry.gpu_busy.cache_clear()

    def _alloc(self) -> dict:
        self.allocated += 1
        return {}

    def _free(self, sample: dict) -> None:
        self.allocated -= 1

    def _metrics(self, query: Any) -> Any:
        first, last = query.sample1, query.sample2
        assert query.metrics[0].metricId == self.NVML_GPM_METRIC_GRAPHICS_UTIL
        span = last["at"] - first["at"]  # 0 on the test's clock between two samples with nothing done
        query.metrics[0].value = 100 * (last["active"] - first["active"]) / span if span else 0.0
        query.metrics[0].nvmlReturn = self.error
        return query


def test_a_phase_reads_the_seconds_the_gpu_was_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """``perf/gpu_busy_s/{phase}``: 0.05 s of kernels in a generation of 0.2 s (a host-bound decode)
    reads 0.05 s, a phase entered twice adds up, and every sample is freed; a GPU or driver without
    GPM, or whose GPM lists the metric but fails to read it, reports nothing."""
    from easyr1 import telemetry
    from easyr1.telemetry import StepTelemetry

    _FakeAllocator(allocated=10.0, reserved=50.0, other=5.0).install(monkeypatch)
    gpm = _FakeGpm()
    gpm.install(monkeypatch)
    try:
        tele = StepTelemetry(torch.device("cuda"))
        for _ in range(2):
            with tele.phase("gen"):
                gpm.now += 0.2
                gpm.active += 0.05
        with tele.phase("update_actor"):
            gpm.now += 0.1
            gpm.active += 0.1
        assert tele.metrics["perf/gpu_busy_s/gen"] == pytest.approx(0.1)
        assert tele.metrics["perf/gpu_busy_s/update_actor"] == pytest.approx(0.1)
        assert tele.metrics["timing_s/gen"] == pytest.approx(0.4) and gpm.allocated == 0

        for fault in ("supported", "error"):
            gpm.supported, gpm.error = fault != "supported", 3 if fault == "error" else 0
            telemetry.gpu_busy.cache_clear()
            tele = StepTelemetry(torch.device("cuda"))
            with tele.phase("gen"):
                pass
            assert "perf/gpu_busy_s/gen" not in tele.metrics and "timing_s/gen" in tele.metrics
            assert gpm.allocated == 0
    finally:
        telemetry._nvml_handle.cache_clear()
        telemetry.gpu_busy.cache_clear()


class _FakeAllocator:
    """A GPU's memory as torch's caching allocator and the driver report it, in GiB (this machine has
    no GPU): ``other`` is outside torch (the CUDA context, another process, vLLM's mapped pool)."""

    def __init__(self, allocated: float, reserved: float, other: float, total: float = 140.0):
        self.allocated, self.reserved, self.other, self.total = allocated, reserved, other, total
        self.peak_allocated, self.peak_reserved = allocated, reserved

    def malloc(self, gib: float) -> None:
        """An allocation: from the cache's free blocks if they hold it, else from the device."""
        self.allocated += gib
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated, self.peak_reserved = (
            max(self.peak_allocated, self.allocated),
            max(self.peak_reserved, self.reserved),
        )

    def free(self, gib: float) -> None:
        self.allocated -= gib

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from easyr1.telemetry import GIB

        def reset(device: object = None) -> None:
            self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

        for name, value in {
            "synchronize": lambda device=None: None,
            "reset_peak_memory_stats": reset,
            "mem_get_info": lambda device=None: (
                int((self.total - self.reserved - self.other) * GIB),
                int(self.total * GIB),
            ),
            "memory_allocated": lambda device=None: int(self.allocated * GIB),
            "memory_reserved": lambda device=None: int(self.reserved * GIB),
            "max_memory_allocated": lambda device=None: int(self.peak_allocated * GIB),
            "max_memory_reserved": lambda device=None: int(self.peak_reserved * GIB),
        }.items():
            monkeypatch.setattr(torch.cuda, name, value)


def test_the_device_peak_counts_what_the_allocator_took_not_what_it_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``perf/max_memory_device_gb``: a phase that starts with 40 GiB of cached free blocks and
    allocates 30 GiB in them holds no more of the device than at its start (it used to read 30 GiB
    higher: the H200 anchor's update recorded 147.5 GiB on a 139.8 GiB GPU); one that outgrows the
    cache adds what it reserved; vLLM waking up within a phase (memory outside torch) counts at its end."""
    from easyr1.telemetry import StepTelemetry

    gpu = _FakeAllocator(allocated=10.0, reserved=50.0, other=5.0)
    gpu.install(monkeypatch)
    tele = StepTelemetry(torch.device("cuda"))
    with tele.phase("update_actor"):
        gpu.malloc(30.0)
        gpu.free(30.0)
    assert tele.metrics["perf/max_memory_device_gb/update_actor"] == pytest.approx(55.0)
    assert tele.metrics["perf/max_memory_allocated_gb/update_actor"] == pytest.approx(40.0)
    assert tele.metrics["perf/gpu_other_memory_gb"] == pytest.approx(5.0)

    with tele.phase("ref_log_prob"):
        gpu.malloc(60.0)  # 70 allocated: 20 GiB more than the cache held
        gpu.free(60.0)
    assert tele.metrics["perf/max_memory_device_gb/ref_log_prob"] == pytest.approx(75.0)

    with tele.phase("gen"):
        gpu.other += 50.0  # vLLM's weights and KV cache mapped back in
    assert tele.metrics["perf/max_memory_device_gb/gen"] == pytest.approx(125.0)


def test_out_of_memory_is_tagged_with_its_phase_and_recorded(tmp_path: Path) -> None:
    """A CUDA out-of-memory error is raised by hand here (this machine has no GPU): the phase it
    happened in reaches the report the trainer writes, and the benchmark counts the run as not fitting."""
    from easyr1.config import load_config
    from easyr1.launch.rank import report_out_of_memory
    from easyr1.telemetry import StepTelemetry
    from easyr1.trainer import Dist

    tele = StepTelemetry(torch.device("cpu"))
    with pytest.raises(torch.OutOfMemoryError) as caught:
        with tele.phase("update_actor"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert caught.value.easyr1_phase == "update_actor"
    config = load_config([f"trainer.save_checkpoint_path={tmp_path / 'run'}"])
    path = report_out_of_memory(config, Dist(0, 1, 0, torch.device("cpu")), caught.value)
    assert path == tmp_path / "run" / "oom-rank0.json"
    memory = bench.memory_summary([], tmp_path / "run", 24.0)
    assert memory["fits"] is False and memory["oom"]["phase"] == "update_actor"
    assert memory["oom"]["error"].startswith("CUDA out of memory")


def test_out_of_memory_with_blocks_kept_by_auto_checkpointing_says_how_to_recompute_them() -> None:
    from easyr1.activations import RecomputePlan
    from easyr1.launch.rank import checkpointing_advice

    advice = checkpointing_advice(RecomputePlan(6), 28)
    assert (
        "planned 6 of 28 decoder blocks recomputed" in advice
        and "enable_gradient_checkpointing=true" in advice
    )
    advice = checkpointing_advice(RecomputePlan(2, attention=20, pointwise=1), 28)
    assert "2 of 28 decoder blocks recomputed, 20 their attention and 1 their elementwise work only" in advice
    assert checkpointing_advice(RecomputePlan(28), 28) == checkpointing_advice(None, 28) == ""


def test_memory_summary_takes_each_phase_peak_over_every_step(tmp_path: Path) -> None:
    steps = [
        {
            "step": 1,
            "perf/max_memory_reserved_gb/update_actor": 20.0,
            "perf/max_memory_allocated_gb/update_actor": 18.0,
            "perf/max_memory_reserved_gb": 20.0,
            "perf/gpu_other_memory_gb": 0.5,
        },
        {
            "step": 2,
            "perf/max_memory_reserved_gb/update_actor": 21.0,
            "perf/max_memory_allocated_gb/update_actor": 17.0,
            "perf/max_memory_reserved_gb/gen": 9.0,
            "perf/gpu_other_memory_gb": 0.75,
        },
    ]
    memory = bench.memory_summary(steps, tmp_path, 22.0)
    assert memory["memory_phases"] == {
        "update_actor": {"reserved": 21.0, "allocated": 18.0},
        "gen": {"reserved": 9.0},
    }
    assert memory["peak_held_gib"] == 21.75 and memory["peak_needed_gib"] == 18.75 and memory["fits"] is True
    assert bench.memory_summary(steps, tmp_path, 18.5)["fits"] is False  # the context pushes it past the cap


def test_gpu_memory_cap_is_inert_on_a_cpu_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from easyr1.telemetry import GPU_MEMORY_ENV, cap_gpu_memory

    monkeypatch.setenv(GPU_MEMORY_ENV, "24")
    assert cap_gpu_memory(torch.device("cpu")) is None


def test_memory_workloads_carry_easyr1_settings() -> None:
    overrides = {**workloads.EASYR1_EXAMPLE, **workloads.PRECISIONS["lora"]}
    work = workloads.WORKLOADS["easyr1_7b"]
    assert (work.prompt_tokens, work.response_tokens, work.size) == (2048, 2048, "7b")
    assert overrides["worker.actor.micro_batch_size_per_device_for_update"] == 1
    assert (
        overrides["worker.actor.model.lora.rank"] == 64 and "worker.actor.fsdp.torch_dtype" not in overrides
    )
    # EasyR1's example recomputes every block; the other workloads take the default (auto).
    assert overrides["worker.actor.model.enable_gradient_checkpointing"] is True
    assert "worker.actor.model.enable_gradient_checkpointing" not in workloads.workload_config("anchor")


def test_per_rank_workloads_take_a_prompt_a_rank_and_vllm_holds_a_whole_sequence() -> None:
    """The memory and long-sequence workloads keep each GPU's share of the one-GPU run (two GPUs
    take two prompts: one prompt would not divide between the ranks), the others their prompts;
    vLLM's batch holds a whole prompt and response (chunked prefill is off)."""
    from easyr1.config import load_config
    from easyr1.config_checks import check_config

    for name, gpus, prompts in (
        ("easyr1_7b", 2, 2),
        ("long_16k", 2, 2),
        ("long_16k", 1, 1),
        ("anchor", 2, 8),
    ):
        config = workloads.workload_config(name, "vllm", gpus)
        assert config["data.rollout_batch_size"] == config["worker.actor.global_batch_size"] == prompts, name
        assert (
            config["worker.actor.micro_batch_size_per_device_for_update"] * gpus
            <= prompts * WORKLOADS[name].n
        )
        settings = {**config, "data.train_files": "x", "worker.actor.model.model_path": "x"}
        check_config(
            load_config([f"{k}={override_value(v)}" for k, v in settings.items()]), gpus
        )  # no ConfigError
    assert workloads.workload_config("long_16k")["worker.rollout.max_num_batched_tokens"] == 256 + 16384
    assert (
        workloads.workload_config("anchor")["worker.rollout.max_num_batched_tokens"] == 8192
    )  # EasyR1's default


def test_easyr1_scale_workloads_run_its_example_at_its_size() -> None:
    """EasyR1's example as its published rows ran it: 512 prompts x 5 a step, four updates of 128
    prompts, AMP, vLLM engines of two GPUs (one on one GPU), its image pixel bounds; valid on 1 to 8 GPUs."""
    from easyr1.config import load_config
    from easyr1.config_checks import check_config

    for name in ("easyr1_scale_7b", "easyr1_scale_vl_7b"):
        for gpus in (1, 2, 4, 8):
            config = workloads.workload_config(name, "vllm", gpus)
            assert config["worker.rollout.tensor_parallel_size"] == min(2, gpus)
            assert (
                config["data.rollout_batch_size"],
                config["worker.actor.global_batch_size"],
                config["worker.rollout.n"],
            ) == (512, 128, 5)
            assert (config["data.min_pixels"], config["data.max_pixels"]) == (262144, 4194304)
            assert (
                config["worker.actor.optim.strategy"] == "adamw"
                and "worker.actor.fsdp.torch_dtype" not in config
            )  # AMP
            settings = {**config, "data.train_files": "x", "worker.actor.model.model_path": "x"}
            check_config(
                load_config([f"{k}={override_value(v)}" for k, v in settings.items()]), gpus
            )  # no ConfigError
        assert workloads.default_precision(name) == "amp"
    assert WORKLOADS["easyr1_scale_vl_7b"].image_size ** 2 == 262144  # EasyR1's min_pixels
    assert (
        workloads.workload_config("anchor", "vllm", 2)["worker.rollout.tensor_parallel_size"] == 2
    )  # one engine over all
    assert workloads.default_precision("easyr1_7b") == "bf16"


# The TRL peer with vLLM colocated (`easyr1 bench --trl-vllm`, `bench/trl_peer.py --mode vllm`).


H200_GIB = 139.8


def _our_engine(name: str, model: str = "m", **rollout: Any) -> dict[str, Any]:
    """What our vLLM rollout gives vllm.LLM for workload ``name`` on one GPU, from its own function."""
    from easyr1.rollout.config import RolloutConfig
    from easyr1.rollout.vllm import engine_kwargs

    work = WORKLOADS[name]
    cfg = RolloutConfig(
        name="vllm",
        n=work.n,
        gpu_memory_utilization=work.vllm_memory,
        ignore_eos=True,
        tensor_parallel_size=1,
        **rollout,
    )
    return engine_kwargs(
        cfg,
        model_path=model,
        tokenizer_path=model,
        max_model_len=work.prompt_tokens + work.response_tokens,
        trust_remote_code=True,
    )


def test_vllm_peer_settings_follow_our_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "trl", None)  # built without trl, and without vllm
    monkeypatch.setitem(sys.modules, "vllm", None)
    peer = _peer()
    anchor = WORKLOADS["anchor"]
    # On an H200 the anchor's 1.5B run fits with vLLM's share kept (free_cache_engine=auto): no sleep
    # mode, for the peer as for us; on a 24 GiB GPU it would not, and both sleep.
    engine = bench.vllm_engine_kwargs("anchor", "qwen2:1.5b", gpu_memory_gib=H200_GIB)
    assert engine == _our_engine("anchor", model="qwen2:1.5b", free_cache_engine=False)
    small = bench.vllm_engine_kwargs("anchor", "qwen2:1.5b", gpu_memory_gib=24)
    assert small == _our_engine("anchor", model="qwen2:1.5b", free_cache_engine=True)
    vllm = peer.grpo_settings(anchor, 5, True, tmp_path, engine)
    hf = peer.grpo_settings(anchor, 5, True, tmp_path)
    # The workload's settings are the HF peer's: prompts, n, lengths, KL, one update per step, bf16, checkpointing.
    shared = {k: v for k, v in hf.items() if k not in ("generation_kwargs", "use_vllm")}
    assert {k: vllm[k] for k in shared} == shared
    assert vllm["use_vllm"] and vllm["vllm_mode"] == "colocate" and vllm["vllm_tensor_parallel_size"] == 1
    assert vllm["vllm_gpu_memory_utilization"] == anchor.vllm_memory == 0.12  # our engine's share of the GPU
    assert vllm["vllm_enable_sleep_mode"] is False and vllm["vllm_max_model_length"] == 768
    assert peer.grpo_settings(anchor, 5, True, tmp_path, small)["vllm_enable_sleep_mode"] is True
    assert vllm["generation_kwargs"]["ignore_eos"] is True  # every completion is 512 tokens, as ours
    assert vllm["vllm_importance_sampling_correction"] is True  # TRL's default, kept and said in `differs`
    # Our compilation settings reach TRL's vllm.LLM call: the very values our rollout passes.
    ours = _our_engine("anchor", free_cache_engine=False)
    assert ours["compilation_config"] is not None and ours["enforce_eager"] is False
    assert peer.llm_settings(engine) == {
        "compilation_config": ours["compilation_config"],
        "enforce_eager": False,
    }
    # Our overrides move the peer's engine with ours.
    overrides = ["worker.rollout.enforce_eager=true", "worker.rollout.free_cache_engine=true"]
    eager = bench.vllm_engine_kwargs("anchor", "m", overrides, gpu_memory_gib=H200_GIB)
    assert eager == _our_engine("anchor", enforce_eager=True, free_cache_engine=True)
    assert peer.llm_settings(eager) == {"enforce_eager": True}
    assert peer.grpo_settings(anchor, 5, True, tmp_path, eager)["vllm_enable_sleep_mode"] is True
    ns = peer.parse_args(
        ["--workload", "anchor", "--model", "m", "--prompts", "p", "--out", "o", "--mode", "vllm", "a.b=1"]
    )
    assert ns.mode == "vllm" and ns.overrides == ["a.b=1"]
    assert (
        peer.parse_args(["--workload", "smoke", "--model", "m", "--prompts", "p", "--out", "o"]).mode == "hf"
    )


@needs_trl
def test_vllm_peer_settings_are_grpo_config_fields(tmp_path: Path) -> None:
    import dataclasses

    import trl

    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    settings = _peer().grpo_settings(
        WORKLOADS["smoke"],
        2,
        False,
        tmp_path,
        bench.vllm_engine_kwargs("smoke", "m", gpu_memory_gib=H200_GIB),
    )
    assert set(settings) <= fields
    config = trl.GRPOConfig(**settings)
    assert config.use_vllm and config.steps_per_generation == 1 and config.generation_batch_size == 8


@needs_trl
def test_vllm_peer_adds_our_compilation_settings_to_trls_llm_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from trl.generation import vllm_generation

    calls: list[dict[str, Any]] = []

    def fake_llm(**kwargs: Any) -> str:
        calls.append(kwargs)
        return "engine"

    monkeypatch.setattr(vllm_generation, "LLM", fake_llm, raising=False)
    peer = _peer()
    extra = peer.llm_settings(bench.vllm_engine_kwargs("anchor", "m", gpu_memory_gib=H200_GIB))
    seen: dict[str, Any] = {}
    with peer.trl_llm_with(extra, seen):
        assert vllm_generation.LLM(model="m", seed=0, max_num_batched_tokens=4096) == "engine"
    assert vllm_generation.LLM is fake_llm  # put back
    assert calls == [seen] and seen == {"model": "m", "seed": 0, "max_num_batched_tokens": 4096, **extra}
    with pytest.raises(RuntimeError, match="compilation_config"):  # TRL's own setting is not overruled
        with peer.trl_llm_with(extra, {}):
            vllm_generation.LLM(model="m", compilation_config={"mode": 3})


def test_vllm_peer_says_what_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "trl", None)
    peer = _peer()
    ours = _our_engine("anchor", free_cache_engine=True)
    theirs = {
        "model": "m",
        "seed": 0,
        "max_num_batched_tokens": 4096,
        "quantization": None,
        **{
            k: ours[k]
            for k in (
                "compilation_config",
                "enforce_eager",
                "gpu_memory_utilization",
                "max_model_len",
                "enable_sleep_mode",
                "tensor_parallel_size",
                "distributed_executor_backend",
                "logprobs_mode",
                "trust_remote_code",
                "dtype",
                "disable_log_stats",
                "enable_chunked_prefill",
            )
        },
    }
    assert peer.engine_differences(ours, theirs) == [
        "vllm.LLM max_num_batched_tokens: ours 8192, TRL's 4096",
        "vllm.LLM seed: ours 1, TRL's 0",
    ]  # the folder named as tokenizer too, and None for unset, are no difference
    differs = peer.differences("vllm", ours, theirs)
    assert any(d.startswith("importance-sampling correction") for d in differs)
    assert "vllm.LLM seed: ours 1, TRL's 0" in differs and set(peer.DIFFERS_SHARED) <= set(differs)
    assert not any("importance" in d for d in peer.differences("hf"))


def test_trl_vllm_refused_before_training_without_vllm(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without vLLM
    with pytest.raises(SystemExit):
        bench.main(["--workload", "smoke", "--trl-vllm", "--root", str(tmp_path)])
    err = capsys.readouterr().err
    assert "--trl-vllm needs" in err and "vllm" in err.split("--trl-vllm needs")[1]
    with pytest.raises(SystemExit):  # one peer a run
        bench.main(["--workload", "smoke", "--trl", "--trl-vllm", "--root", str(tmp_path)])
    with pytest.raises(SystemExit):  # prompts of varied lengths: not a peer workload
        bench.main(["--workload", "anchor_varied", "--trl", "--root", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # nothing was built or trained


def test_vllm_peer_record_is_summarised_with_its_mode(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import easyr1.launch.local

    monkeypatch.setattr(easyr1.launch.local, "launch", _fake_launch([5.0, 2.0, 3.0]))
    monkeypatch.setattr(
        bench, "peer_refusal", lambda mode, workload, overrides: None
    )  # as on a GPU host with vLLM
    seen: dict[str, Any] = {}

    def run_trl(
        name: str,
        steps: int,
        model: str,
        prompts: str,
        out: Path,
        mode: str = "hf",
        overrides: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        seen.update(name=name, out=out, mode=mode, overrides=overrides)
        return {"mode": mode, "step_times": [9.0, 6.0, 4.0], "tokens_per_step": 640, "differs": ["x"]}

    monkeypatch.setattr(bench_peer, "run_trl", run_trl)
    out = tmp_path / "summary.json"
    argv = [
        "--workload",
        "smoke",
        "--steps",
        "3",
        "--root",
        str(tmp_path),
        "--out",
        str(out),
        "--trl-vllm",
        "worker.rollout.enforce_eager=true",
    ]
    assert bench.main(argv) == 0
    assert seen == {
        "name": "smoke",
        "out": tmp_path / "smoke" / "trl_vllm.json",
        "mode": "vllm",
        "overrides": ["worker.rollout.enforce_eager=true"],
    }
    summary = json.loads(out.read_text())
    assert set(summary) == SUMMARY_KEYS | TRL_KEYS
    assert summary["trl"]["mode"] == "vllm" and summary["trl"]["differs"] == ["x"]
    assert summary["trl_step_s"] == 5.0 and summary["speedup_vs_trl"] == 2.0

    record = {
        **_peer().figures(WORKLOADS["anchor"], [20.0, 8.0, 5.0], [512.0]),
        "mode": "vllm",
        "differs": ["y"],
    }
    both = with_trl(summarize(_metrics(tmp_path / "m.jsonl", [10.0, 4.0, 2.0]), "anchor", "vllm", 1), record)
    assert both["trl"]["mode"] == "vllm" and both["speedup_vs_trl"] == pytest.approx(6.5 / 3.0)


def _reduce_readings(rank: int, port: int, out: Any) -> None:
    import logging

    import torch.distributed as dist

    from easyr1.metrics import all_reduce_sums
    from easyr1.telemetry import on_every_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("easyr1.telemetry").addHandler(handler)
    try:
        readings = {"timing_s/gen": 1.0 + rank, "perf/cpu_steal_s": 0.1}
        if rank == 1:  # this rank's GPU has NVML's performance monitoring, rank 0's does not
            readings["perf/gpu_busy_s/gen"] = 0.5
        out[rank] = (
            all_reduce_sums(on_every_rank(readings)),
            all_reduce_sums(on_every_rank(readings)),
            warnings,
        )
    finally:
        dist.destroy_process_group()


def test_a_reading_some_ranks_lack_is_left_out_of_the_reductions() -> None:
    """Rank 1 reads the GPU's busy time and rank 0 cannot: summed key by key, the ranks' lists would
    not line up (a hang, or one reading added to another); the reading is left out, with one warning."""
    import torch.multiprocessing as mp

    from easyr1.distributed.ports import free_port

    out = mp.Manager().dict()
    mp.spawn(_reduce_readings, args=(free_port(), out), nprocs=2)
    expected = {"perf/cpu_steal_s": pytest.approx(0.2), "timing_s/gen": 3.0}
    for rank in (0, 1):
        first, second, _ = out[rank]
        assert first == second == expected
    assert (
        out[0][2] == ["not every rank took these readings; left out: perf/gpu_busy_s/gen"] and out[1][2] == []
    )
