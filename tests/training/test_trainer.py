"""The real RL loop on tiny models with 2 CPU ranks: metrics, VLMs, checkpoints, failure handling."""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest

from easyr1.data.synthetic import write_task
from tests.trainer_utils import read_metrics, run_train, tiny_config

# The metric names of DESIGN.md that every training step must log.
STEP_METRICS = [
    "perf/throughput",
    "perf/time_per_step",
    "perf/cpu_memory_used_gb",
    "perf/gc_s",
    "perf/gc_full",
    "perf/cpu_process_s",
    "perf/cpu_others_s",
    "perf/cpu_steal_s",
    "perf/calibration_cpu_s",  # CPU ranks
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref_log_prob",
    "timing_s/adv",
    "timing_s/update_actor",
    "reward/overall",
    "reward/accuracy",
    "reward/format",
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "response_length/clip_ratio",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "actor/pg_loss",
    "actor/pg_clipfrac_higher",
    "actor/pg_clipfrac_lower",
]
# Logged where worker.rollout.calculate_log_probs asks the rollout for its log-probs.
ROLLOUT_LOGP_METRICS = [
    "rollout/logp_diff_mean",
    "rollout/logp_diff_max",
    "rollout/ratio_mean",
    "rollout/ratio_max",
]


@pytest.fixture(scope="session")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    write_task("mixed", root, n_train=32, n_test=8, seed=0)
    return root


def test_text_run_logs_every_metric_and_resumes(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_model("qwen2"), arithmetic, run_dir)
    done = run_train(
        config,
        tmp_path,
        "trainer.max_steps=2",
        "trainer.save_freq=2",
        "worker.rollout.calculate_log_probs=true",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert "val/accuracy_reward" in metrics[0] and "val/accuracy_reward" in metrics[2]
    for step in metrics[1:]:
        missing = [name for name in STEP_METRICS + ROLLOUT_LOGP_METRICS if name not in step]
        assert not missing, f"step {step['step']} lacks {missing}"
    # fp32 on CPU: the actor re-scores exactly what the rollout sampled.
    assert metrics[1]["rollout/logp_diff_max"] < 1e-4
    assert (run_dir / "global_step_2" / "checkpoint_complete.json").is_file()
    assert (run_dir / "generations.jsonl").read_text().strip()

    # A longer run in the same folder resumes from step 2 instead of starting over.
    resumed = run_train(config, tmp_path, "trainer.max_steps=3", "trainer.save_freq=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert [m["step"] for m in read_metrics(run_dir)] == [0, 1, 2, 3]


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def test_vlm_run_on_images(
    tiny_model: Callable[[str], Path], shapes: Path, tmp_path: Path, arch: str
) -> None:
    """Image rows and text rows in one data set, through rollout, log-probs and the update."""
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_model(arch), shapes, run_dir)
    done = run_train(config, tmp_path, "trainer.max_steps=2", "worker.rollout.calculate_log_probs=true")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run_dir)
    for step in metrics[1:]:
        missing = [name for name in STEP_METRICS + ROLLOUT_LOGP_METRICS if name not in step]
        assert not missing, f"step {step['step']} lacks {missing}"
        assert step["rollout/logp_diff_max"] < 1e-4  # image tokens included


REWARD_THAT_OVERFLOWS = '''
CALLS = {"n": 0}


def compute_score(reward_inputs):
    """Sane at the first step, then scores whose group mean overflows float32 (NaN advantages)."""
    CALLS["n"] += 1
    if CALLS["n"] == 1:
        return [{"overall": float(len(r["response"]) % 2)} for r in reward_inputs]
    return [{"overall": 3.0e38 * (-1) ** i} for i, _ in enumerate(reward_inputs)]
'''


def test_nan_loss_stops_the_run_and_keeps_what_was_written(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    reward = tmp_path / "overflow.py"
    reward.write_text(REWARD_THAT_OVERFLOWS)
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_model("qwen2"), arithmetic, run_dir)
    done = run_train(
        config,
        tmp_path,
        f"worker.reward.reward_function={reward}:compute_score",
        "algorithm.norm_adv_by_std_in_grpo=false",
        "trainer.val_before_train=false",
        "trainer.max_steps=3",
        "trainer.save_freq=1",
    )
    assert done.returncode != 0
    assert "step 2" in done.stderr and "NaN" in done.stderr
    assert [m["step"] for m in read_metrics(run_dir)] == [1]
    assert (run_dir / "global_step_1" / "checkpoint_complete.json").is_file()
    assert not (run_dir / "global_step_2").exists()


REWARD_THAT_HANGS = """
import time

REWARD_TYPE = "sequential"


def main(reward_input):
    time.sleep(3600)
"""


def processes_in(folder: Path) -> list[int]:
    """Live processes whose working directory is ``folder``: a run's launcher, ranks and reward workers."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")) == folder:
                found.append(int(proc.name))
        except OSError:  # gone, a zombie, or not ours to read
            continue
    return found


def test_a_reward_that_hangs_ends_the_run_naming_its_input(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    reward = tmp_path / "hangs.py"
    reward.write_text(REWARD_THAT_HANGS)
    config = tiny_config(tiny_model("qwen2"), arithmetic, tmp_path / "run")
    done = run_train(  # without a timeout, this run never ended
        config,
        tmp_path,
        f"worker.reward.reward_function={reward}",
        "worker.reward.timeout=2",
        "trainer.val_before_train=false",
        "trainer.stall_report_s=1",
        timeout=300,
    )
    assert done.returncode != 0
    expected = (
        r"hangs.py:main did not return within 2 s on input 0 of \d+ \(response '.*', ground_truth '.*'\)"
    )
    assert re.search(expected, done.stderr), done.stderr[-3000:]
    # While it waited, the stall report said where: every second, each rank's stacks (easyr1/stalls.py).
    assert re.search(r"^\[rank [01]\] Timeout \(0:00:01\)!$", done.stderr, re.M), done.stderr[-3000:]
    assert re.search(r'File ".*easyr1/rewards/worker\.py", line \d+ in _receive', done.stderr), done.stderr[
        -3000:
    ]
    deadline = time.monotonic() + 5
    while (
        processes_in(tmp_path) and time.monotonic() < deadline
    ):  # the kernel's SIGKILL to a worker is asynchronous
        time.sleep(0.1)
    assert processes_in(tmp_path) == []


@pytest.mark.parametrize(
    "precision",
    [
        # AMP, EasyR1's default: fp32 master weights, bf16 compute.
        ["worker.actor.fsdp.torch_dtype=null", "worker.actor.fsdp.mp_param_dtype=bf16"],
        # BF16: bf16 weights and the Kahan-compensated bf16 AdamW.
        ["worker.actor.fsdp.torch_dtype=bf16", "worker.actor.optim.strategy=adamw_bf16"],
    ],
    ids=["amp", "bf16"],
)
def test_precisions_train(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path, precision: list[str]
) -> None:
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_model("qwen2"), arithmetic, run_dir)
    done = run_train(
        config, tmp_path, *precision, "worker.ref.fsdp.torch_dtype=bf16", "trainer.val_before_train=false"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = read_metrics(run_dir)
    assert [m["step"] for m in steps] == [1, 2]
    for step in steps:
        assert all(math.isfinite(step[k]) for k in ("actor/entropy", "actor/grad_norm", "actor/pg_loss"))
        assert step["perf/throughput"] > 0
        # By default the rollout returns no log-probs, so nothing compares them with the actor's.
        assert not [name for name in ROLLOUT_LOGP_METRICS if name in step]


REWARD_THAT_LOGS = """
import os

REWARD_TYPE = "sequential"


def compute_score(reward_input):
    with open(os.environ["SCORED_LOG"], "a") as log:
        log.write(reward_input["ground_truth"] + "\\n")
    return {"overall": 0.0}
"""


def test_validation_scores_the_whole_test_set_in_batches(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """EasyR1's data.val_batch_size is the size of validation's batches, not a cap on its rows: a
    test set of 12 rows with val_batch_size=4 is scored whole, each row once."""
    data = tmp_path / "data"
    write_task("arithmetic", data, n_train=8, n_test=12, seed=0)
    (tmp_path / "logged.py").write_text(REWARD_THAT_LOGS)
    log = tmp_path / "scored.txt"
    os.environ["SCORED_LOG"] = str(log)  # the subprocess (and its reward workers) inherit it
    try:
        config = tiny_config(tiny_model("qwen2"), data, tmp_path / "run")
        done = run_train(
            config,
            tmp_path,
            "data.val_batch_size=4",
            "trainer.val_only=true",
            f"worker.reward.reward_function={tmp_path / 'logged.py'}:compute_score",
        )
    finally:
        del os.environ["SCORED_LOG"]
    assert done.returncode == 0, done.stderr[-3000:]
    answers = pyarrow.parquet.read_table(data / "test.parquet").column("answer").to_pylist()
    assert len(answers) == 12 and sorted(log.read_text().split()) == sorted(map(str, answers))
    [record] = read_metrics(tmp_path / "run")
    assert record["step"] == 0 and "val/reward_score" in record


def test_val_only_evaluates_the_checkpoint_it_resumes_from(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """EasyR1's way to evaluate a checkpoint: ``trainer.val_only=true`` on a run folder with a
    checkpoint validates the resumed weights, logged at the checkpoint's step (it used to resume and
    exit having logged nothing); without a test set it is refused before any rank starts."""
    data = tmp_path / "data"
    write_task("arithmetic", data, n_train=8, n_test=4, seed=0)
    config = tiny_config(tiny_model("qwen2"), data, tmp_path / "run")
    config["trainer"].update(max_steps=1, save_freq=1, val_freq=-1)
    trained = run_train(config, tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    evaluated = run_train(config, tmp_path, "trainer.val_only=true")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    records = read_metrics(tmp_path / "run")
    assert [(r["step"], "val/reward_score" in r) for r in records] == [(0, True), (1, False), (1, True)]
    refused = run_train(config, tmp_path, "trainer.val_only=true", "data.val_files=")
    assert (
        refused.returncode != 0
        and "trainer.val_only=true validates on data.val_files, which is empty" in refused.stderr
    )


# Scores by the answer alone: odd answers score 1; `even` is returned only for even answers, so the
# ranks' key sets differ where one rank holds only odd answers.
REWARD_BY_PARITY = """
REWARD_TYPE = "sequential"


def compute_score(reward_input):
    answer = int(reward_input["ground_truth"])
    return {"overall": float(answer % 2), **({"even": 1.0} if answer % 2 == 0 else {})}
"""


@pytest.mark.parametrize("answers", [["2", "3", "4"], ["5"]], ids=["odd-count", "fewer-rows-than-ranks"])
def test_validation_over_uneven_shares_and_keys_some_inputs_lack(
    tiny_model: Callable[[str], Path], tmp_path: Path, answers: list[str]
) -> None:
    """3 test rows on 2 ranks (rank 1: one odd answer, so no `even` key) and 1 row on 2 ranks (rank 1:
    no row at all): validation completes, each row counts once, and a key's mean is over the inputs
    that returned it, as EasyR1 averages its reward metrics. (A rank without rows used to wait in the
    metrics' all-reduce for ever; keys that differed between ranks broke it or mixed metrics up.)"""
    data = tmp_path / "data"
    write_task("arithmetic", data, n_train=8, n_test=len(answers), seed=0)
    test = pyarrow.parquet.read_table(data / "test.parquet")
    test = test.set_column(test.schema.get_field_index("answer"), "answer", pyarrow.array(answers))
    pyarrow.parquet.write_table(test, data / "test.parquet")
    (tmp_path / "parity.py").write_text(REWARD_BY_PARITY)
    config = tiny_config(tiny_model("qwen2"), data, tmp_path / "run")
    done = run_train(
        config,
        tmp_path,
        "data.val_batch_size=2",
        "trainer.val_only=true",
        f"worker.reward.reward_function={tmp_path / 'parity.py'}:compute_score",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = read_metrics(tmp_path / "run")
    odd = [int(a) % 2 for a in answers]
    assert record["val/overall_reward"] == record["val/reward_score"] == pytest.approx(sum(odd) / len(odd))
    assert record.get("val/even_reward") == (1.0 if 0 in odd else None)
    lengths = [record[f"val_response_length/{k}"] for k in ("min", "mean", "max")]
    assert (
        1 <= lengths[0] <= lengths[1] <= lengths[2] <= 12
        and 0 <= record["val_response_length/clip_ratio"] <= 1
    )


def test_when_one_rank_fails_the_others_say_one_line_not_a_collectives_traceback(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    """Rank 1's reward raises; rank 0, waiting in a gloo collective, loses its peer. Its message is one
    line pointing at rank 1's error, which stays the only traceback (rank 0 printed gloo's before)."""
    (tmp_path / "rank1.py").write_text(
        "import os\n\nREWARD_TYPE = 'sequential'\n\n\ndef compute_score(x):\n    if os.environ['RANK'] == '1':\n        raise ValueError('rank 1 only')\n"
        "    return {'overall': 0.0}\n"
    )
    config = tiny_config(tiny_model("qwen2"), arithmetic, tmp_path / "run")
    done = run_train(
        config,
        tmp_path,
        f"worker.reward.reward_function={tmp_path / 'rank1.py'}:compute_score",
        "trainer.val_before_train=false",
        timeout=300,
    )
    assert done.returncode == 1
    assert "easyr1 train: rank 1: RewardFunctionError" in done.stderr and "rank 1 only" in done.stderr, (
        done.stderr[-3000:]
    )
    assert "[rank0]" not in done.stderr and done.stderr.count("Traceback") == 1, done.stderr[-3000:]


def test_a_reward_that_raises_ends_the_run_with_the_users_traceback(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    """The user's own traceback, which the reward worker keeps as a note, is printed with the error."""
    (tmp_path / "zero.py").write_text(
        "REWARD_TYPE = 'sequential'\n\n\ndef compute_score(x):\n    return {'overall': 1 / 0}\n"
    )
    config = tiny_config(tiny_model("qwen2"), arithmetic, tmp_path / "run")
    done = run_train(
        config,
        tmp_path,
        f"worker.reward.reward_function={tmp_path / 'zero.py'}:compute_score",
        "trainer.val_before_train=false",
        timeout=300,
    )
    assert done.returncode != 0
    assert (
        "raised ZeroDivisionError" in done.stderr and 'zero.py", line 5, in compute_score' in done.stderr
    ), done.stderr[-3000:]
