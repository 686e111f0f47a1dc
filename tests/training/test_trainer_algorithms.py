"""Every algorithm of examples/tiny trains on 2 CPU ranks; DAPO's filter, ReMax's baseline and
the PPO critic (its loss, its checkpoint), each checked on its own.

Each run costs 25-45 s on 2 shared cores, nearly all of it process start-up, so each
algorithm runs once: DAPO and PPO in their own tests, which check more of their run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml

from easyr1.algorithms.filtering import BatchFillError, batch_layout, fill_batch, keep_group, split_groups
from easyr1.config import ConfigError, PPOConfig
from easyr1.config_checks import check_config
from easyr1.data.synthetic import write_task
from easyr1.experience import Experience, experience
from easyr1.rollout.base import Rollout, SamplingParams
from easyr1.telemetry import StepTelemetry
from easyr1.trainer import Dist, Trainer
from easyr1.workers.config import CriticConfig
from tests.trainer_utils import read_metrics, run_train

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tiny"
# DAPO and PPO run in their own tests below.
ALGORITHMS = [
    "grpo",
    "dr_grpo",
    "gspo",
    "cispo",
    "sapo",
    "rloo",
    "grpo_passk",
    "reinforce_plus_plus",
    "remax",
]
TRAINED = ["actor/pg_loss", "actor/entropy", "actor/grad_norm", "reward/overall", "timing_s/update_actor"]
UNTIMED = ("timing_s/", "perf/")

# Half the responses of a group score 1, at random: groups are all-0, all-1 or mixed.
PARITY_REWARD = """
def compute_score(reward_inputs):
    return [{"overall": float(len(r["response"]) % 2), "accuracy": float(len(r["response"]) % 2)} for r in reward_inputs]
"""


@pytest.fixture(scope="module")
def arithmetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("arithmetic")
    write_task("arithmetic", root, n_train=64, n_test=8, seed=0)
    return root


def example(name: str, model: Path, data: Path, run_dir: Path) -> dict[str, Any]:
    """examples/tiny/compare_{name}.yaml pointed at the test's model and data, made small."""
    config = yaml.safe_load((EXAMPLES / f"compare_{name}.yaml").read_text())
    config["data"].update(
        train_files=f"{data}@train", val_files=f"{data}@test", rollout_batch_size=4, max_response_length=8
    )
    if "mini_rollout_batch_size" in config["data"]:
        config["data"]["mini_rollout_batch_size"] = 4
    workers = config["worker"]
    for role in ("actor", "critic"):
        if role in workers:
            workers[role].update(
                global_batch_size=2,
                micro_batch_size_per_device_for_update=4,
                micro_batch_size_per_device_for_experience=8,
            )
    workers["actor"]["model"]["model_path"] = str(model)
    workers["rollout"]["n"] = min(workers["rollout"]["n"], 2)
    if isinstance(workers["reward"].get("reward_function_kwargs"), dict):
        workers["reward"]["reward_function_kwargs"]["max_response_length"] = 8
        workers["reward"]["reward_function_kwargs"]["overlong_buffer_length"] = 4
    config["trainer"].update(
        max_steps=2, val_before_train=False, val_freq=-1, logger=["file"], save_checkpoint_path=str(run_dir)
    )
    return config


# ------------------------------------------------------------------ every algorithm trains


def check_trained(steps: list[dict[str, Any]], expected: list[str]) -> None:
    for step in steps:
        missing = [key for key in expected if key not in step]
        assert not missing, f"step {step['step']} lacks {missing}"
        assert all(math.isfinite(step[key]) for key in expected)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_example_trains(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path, name: str
) -> None:
    run_dir = tmp_path / "run"
    done = run_train(example(name, tiny_model("qwen2"), arithmetic, run_dir), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = read_metrics(run_dir)
    assert [m["step"] for m in steps] == [1, 2]
    check_trained(steps, TRAINED)


# ------------------------------------------------------------------ DAPO's online filter


def _group(*scores: float) -> list[dict[str, float]]:
    return [{"overall": s, "accuracy": s} for s in scores]


def test_filter_drops_uniform_groups_and_refills() -> None:
    rounds = iter(
        [
            # round 1: one all-correct, one all-wrong, one mixed group
            [_group(1, 1, 1), _group(0, 0, 0), _group(1, 0, 0)],
            # round 2: all-wrong again, then two mixed groups
            [_group(0, 0, 0), _group(0, 1, 1), _group(1, 0, 1)],
        ]
    )

    def keep(scores: list[dict[str, float]]) -> bool:
        return keep_group(scores, "accuracy", 0.01, 0.99)

    filled = fill_batch(lambda: next(rounds), keep, target=2, max_tries=5)
    assert filled.tries == 2
    assert filled.kept == [_group(1, 0, 0), _group(0, 1, 1), _group(1, 0, 1)]
    assert filled.total_kept == 3
    assert batch_layout(filled.counts, 2) == [(0, 0), (0, 1)]  # the first two kept groups


def test_filter_bounds_are_strict_and_the_key_must_exist() -> None:
    assert not keep_group(_group(0.5, 0.5), "overall", 0.5, 0.9)
    assert keep_group(_group(0.5, 0.7), "overall", 0.5, 0.9)
    with pytest.raises(ConfigError, match="algorithm.filter_key='acc'.*accuracy, overall"):
        keep_group(_group(1, 0), "acc", 0.01, 0.99)


def test_filter_gives_up_after_max_try_make_batch() -> None:
    with pytest.raises(BatchFillError, match="trainer.max_try_make_batch=3"):
        fill_batch(
            lambda: [_group(1, 1)], lambda g: keep_group(g, "overall", 0.01, 0.99), target=1, max_tries=3
        )


def test_kept_groups_are_evened_out_over_ranks_whole() -> None:
    # Two ranks, two rounds: rank 0 kept 3 then 0 groups, rank 1 kept 0 then 2; the batch is 4 groups.
    layout = batch_layout([[3, 0], [0, 2]], target=4)
    assert layout == [(0, 0), (0, 1), (0, 2), (1, 0)]
    shares = split_groups([origin for origin, _ in layout], world=2)
    assert shares == [[0, 1], [3, 2]]  # rank 1 gets its own group and rank 0's surplus
    # Without filtering every rank keeps exactly its own groups.
    assert split_groups([0, 0, 1, 1], world=2) == [[0, 1], [2, 3]]


def test_dapo_run_drops_groups_and_fills_the_batch(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    """The DAPO example, with a reward a random model can earn (response-length parity)."""
    (tmp_path / "parity.py").write_text(PARITY_REWARD)
    run_dir = tmp_path / "run"
    config = example("dapo", tiny_model("qwen2"), arithmetic, run_dir)
    done = run_train(
        config,
        tmp_path,
        f"worker.reward.reward_function={tmp_path / 'parity.py'}:compute_score",
        "worker.reward.reward_function_kwargs={}",
        "algorithm.filter_key=overall",
        "data.rollout_batch_size=4",
        "data.mini_rollout_batch_size=2",
        "worker.rollout.n=2",
        "trainer.max_steps=3",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = read_metrics(run_dir)
    assert [m["step"] for m in steps] == [1, 2, 3]
    check_trained(steps, TRAINED + ["filter/tries", "filter/kept_groups", "filter/dropped_groups"])
    for m in steps:
        # Each round draws 2 prompts; every group is kept or dropped; enough were kept to fill 4.
        assert m["filter/kept_groups"] + m["filter/dropped_groups"] == 2 * m["filter/tries"]
        assert m["filter/kept_groups"] >= 4
    assert sum(m["filter/dropped_groups"] for m in steps) > 0
    assert max(m["filter/tries"] for m in steps) > 2  # the batch needed refilling


# ------------------------------------------------------------------ ReMax's baseline


class _Tokens:
    """Decodes token ids to text: id 5 is "a", anything else "b"."""

    def batch_decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return ["".join("a" if t == 5 else "b" for t in seq) for seq in ids]


def test_remax_subtracts_the_greedy_score() -> None:
    """The trainer asks for a greedy rollout (temperature 0, n=1), scores it, and uses the score
    as each sample's baseline: advantage = score - greedy score."""
    config = PPOConfig()
    config.algorithm.adv_estimator = "remax"
    config.algorithm.disable_kl = True
    config.worker.rollout.n = 3
    trainer = Trainer.__new__(Trainer)
    trainer.config, trainer.ctx = config, Dist(0, 1, 0, torch.device("cpu"))
    trainer.tokenizer, trainer.needs_ref = _Tokens(), False
    trainer.reward_fn = lambda inputs: [{"overall": float(item["response"].count("a"))} for item in inputs]
    requests: list[SamplingParams] = []

    def generate(prompts: list[dict[str, Any]], params: SamplingParams, seed: int) -> Rollout:
        requests.append(params)
        # Greedy: 2 "a"s for prompt 0, 1 for prompt 1. Sampled: 0, 1, 3 "a"s for each prompt.
        responses = [[5, 5, 7], [5, 7]] if params.greedy else [[7], [5, 7], [5, 5, 5]] * 2
        index = [0, 1] if params.greedy else [0, 0, 0, 1, 1, 1]
        ids = [torch.tensor(r) for r in responses]
        return Rollout(index, [prompts[i]["input_ids"] for i in index], ids, [True] * len(index))

    trainer.rollout = SimpleNamespace(
        generate=generate
    )  # a scripted rollout backend: the test is about the baseline
    prompts = [
        {"input_ids": torch.tensor([1, 2]), "multi_modal_inputs": {}, "ground_truth": "x"} for _ in range(2)
    ]
    groups = trainer._generate([10, 11], prompts, seed=0, tele=StepTelemetry(torch.device("cpu")))
    assert [(p.n, p.temperature) for p in requests] == [(3, 1.0), (1, 0.0)]
    assert [g.baseline for g in groups] == [2.0, 1.0]
    exp = experience(groups, first=0, rollout_logprobs=False)
    trainer._advantages(exp, {})
    per_sample = (exp.advantages * exp.response_mask).sum(-1) / exp.response_mask.sum(-1)
    assert per_sample.tolist() == [0 - 2, 1 - 2, 3 - 2, 0 - 1, 1 - 1, 3 - 1]


# ------------------------------------------------------------------ the critic


def test_critic_value_loss_decreases_on_a_fixed_batch(
    tiny_model: Callable[[str], Path], one_rank: None
) -> None:
    from easyr1.models.loading import load_value_model
    from easyr1.workers.config import FSDPConfig
    from easyr1.workers.critic import Critic
    from easyr1.workers.fsdp import parallelize

    torch.manual_seed(0)
    fsdp = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")
    model = parallelize(
        load_value_model(tiny_model("qwen2")), fsdp, trainable=True, device=torch.device("cpu")
    )
    config = CriticConfig(
        global_batch_size=4, micro_batch_size_per_device_for_update=2, cliprange_value=0.5, fsdp=fsdp
    )
    config.optim.lr = 1e-3
    critic = Critic(model, config, samples_per_prompt=1, pad_id=0, total_steps=10, device=torch.device("cpu"))
    lengths = [3, 5, 2, 4]
    mask = torch.zeros(4, 5)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    exp = Experience(
        prompt_ids=[torch.randint(1, 100, (4,)) for _ in lengths],
        response_ids=[torch.randint(1, 100, (n,)) for n in lengths],
        multi_modal_inputs=[{} for _ in lengths],
        group=torch.arange(4),
        response_mask=mask,
        returns=torch.tensor([1.0, -1.0, 0.5, 2.0])[:, None] * mask,
    )
    losses = []
    for step in range(8):
        exp.values = critic.values(exp)
        losses.append(critic.update(exp, step)["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0], losses


def test_entropy_bonus_is_subtracted_from_the_loss(tiny_model: Callable[[str], Path], one_rank: None) -> None:
    from easyr1.algorithms.config import AlgorithmConfig
    from easyr1.models.loading import load_model
    from easyr1.workers.actor import Actor
    from easyr1.workers.config import ActorConfig, FSDPConfig
    from easyr1.workers.fsdp import parallelize
    from easyr1.workers.logprobs import install_scoring_head
    from easyr1.workers.update import Counts

    torch.manual_seed(0)
    fsdp = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")
    model = load_model(tiny_model("qwen2"))
    install_scoring_head(model)
    model = parallelize(model, fsdp, trainable=True, device=torch.device("cpu"))
    mask = torch.ones(2, 3)
    exp = Experience(
        prompt_ids=[torch.randint(1, 100, (4,)) for _ in range(2)],
        response_ids=[torch.randint(1, 100, (3,)) for _ in range(2)],
        multi_modal_inputs=[{}, {}],
        group=torch.arange(2),
        response_mask=mask,
        old_logp=torch.zeros(2, 3),
        advantages=torch.tensor([[1.0] * 3, [-1.0] * 3]),
    )
    counts = Counts(tokens=6.0, seqs=2.0)
    losses = {}
    for coeff in (0.0, 0.1):
        config = ActorConfig(entropy_coeff=coeff, fsdp=fsdp)
        actor = Actor(
            model,
            config,
            AlgorithmConfig(disable_kl=True),
            samples_per_prompt=1,
            max_response_length=3,
            temperature=1.0,
            pad_id=0,
            total_steps=1,
            device=torch.device("cpu"),
        )
        loss, metrics = actor._micro_loss(exp, [0, 1], counts)
        losses[coeff] = (float(loss.detach()), float(metrics["actor/entropy"]))
    (plain, entropy), (with_bonus, _) = losses[0.0], losses[0.1]
    assert entropy > 0
    assert with_bonus == pytest.approx(plain - 0.1 * entropy, rel=1e-5)


# ------------------------------------------------------------------ PPO: the critic in the loop and in checkpoints


def test_ppo_trains_and_resumes_its_critic(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    """The PPO example for 3 steps; then step 3 again, resumed from its step-2 checkpoint in a
    fresh folder, equals the uninterrupted step 3: critic metrics (and weights) were restored."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    config = example("ppo", tiny_model("qwen2"), arithmetic, straight)
    done = run_train(config, tmp_path, "trainer.max_steps=3", "trainer.save_freq=2")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = read_metrics(straight)
    assert [m["step"] for m in steps] == [1, 2, 3]
    check_trained(
        steps,
        TRAINED
        + [
            "critic/vf_loss",
            "critic/vf_clipfrac",
            "critic/vpred_mean",
            "critic/grad_norm",
            "critic/lr",
            "timing_s/values",
            "timing_s/update_critic",
        ],
    )
    assert (straight / "global_step_2" / "critic" / ".metadata").is_file()

    again = run_train(
        config,
        tmp_path,
        "trainer.max_steps=3",
        f"trainer.save_checkpoint_path={resumed}",
        f"trainer.load_checkpoint_path={straight / 'global_step_2'}",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout

    def trained(run: Path) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith(UNTIMED)} for m in read_metrics(run)]

    assert trained(resumed) == trained(straight)[-1:]


# ------------------------------------------------------------------ every example config is valid


CONFIGS = sorted(EXAMPLES.glob("*.yaml"))  # examples/*.yaml: tests/training/test_example_configs.py


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from easyr1.config import load_config

    monkeypatch.chdir(EXAMPLES.parent.parent)  # format prompts are relative to the repository root
    load_config([f"config={path}"])


def test_config_checks_name_the_key() -> None:
    config = PPOConfig()
    config.data.rollout_batch_size, config.worker.actor.global_batch_size = 8, 4
    check_config(config, world=2)
    config.worker.actor.global_batch_size = 3
    with pytest.raises(
        ConfigError, match="worker.actor.global_batch_size=3 must divide data.rollout_batch_size=8"
    ):
        check_config(config, world=2)
    config.worker.actor.global_batch_size = 4
    config.worker.actor.ulysses_size = 2
    check_config(config, world=2)
    config.worker.actor.ulysses_size = 3
    with pytest.raises(ConfigError, match="worker.actor.ulysses_size=3 must divide the 2 ranks"):
        check_config(config, world=2)
    config.worker.actor.ulysses_size = 2
    config.worker.actor.padding_free = False
    with pytest.raises(
        ConfigError,
        match="worker.actor.ulysses_size=2 splits packed rows: set worker.actor.padding_free=true",
    ):
        check_config(config, world=2)
    config.worker.actor.padding_free, config.worker.critic.ulysses_size = True, 2
    check_config(config, world=2)  # the critic's keys count only when there is a critic
    config.algorithm.adv_estimator = "gae"
    config.worker.critic.global_batch_size = 4
    with pytest.raises(ConfigError, match="worker.critic.ulysses_size=2 splits packed rows"):
        check_config(config, world=2)
