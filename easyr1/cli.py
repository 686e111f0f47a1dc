"""One entry point: ``easyr1 <command> ...``.

Commands that configure a run take EasyR1's ``config=FILE.yaml a.b.c=value`` arguments; the
tool commands (tiny models, synthetic data, warm start) take ordinary flags.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType

from easyr1.config import ConfigError, load_config
from easyr1.config_checks import check_config, config_warnings, planned_world
from easyr1.config_docs import explain
from easyr1.rewards.loader import check_reward_config

CONFIG_USAGE = """usage: easyr1 {command} [config=FILE.yaml] [KEY=VALUE ...]

{summary}

The config is EasyR1's: a YAML file (examples/config.yaml) and dotted overrides on top of it, e.g.
  worker.actor.model.model_path=Qwen/Qwen2.5-7B-Instruct data.max_response_length=2048
`easyr1 config` prints every key with the value it resolves to (`easyr1 config` alone: the defaults);
`easyr1 config --explain KEY` what a key means, its type and default, and EasyR1's where it differs.
"""


def _config_help(command: str, args: list[str]) -> bool:
    """``-h``/``--help`` among a config command's arguments: print its usage (and say so)."""
    if not any(a in ("-h", "--help") for a in args):
        return False
    print(CONFIG_USAGE.format(command=command, summary=COMMANDS[command][1]))
    return True


def _cmd_config(args: list[str]) -> int:
    """Print the resolved config (file + overrides) as YAML, ready to be read back. It passes the
    checks every rank of ``easyr1 train`` runs (``check_config``), for the ranks the run will have
    (trainer.nnodes x trainer.n_gpus_per_node), and keys that cannot act here are said on stderr.
    ``--explain KEY`` prints the key's documentation instead (``config_docs.explain``)."""
    if _config_help("config", args):
        return 0
    if args[:1] == ["--explain"]:
        if len(args) != 2:
            raise ConfigError(
                "usage: easyr1 config --explain KEY (a key such as worker.actor.optim.lr, or a section)"
            )
        print(explain(args[1]))
        return 0
    config = load_config(args)
    check_config(config, planned_world(config))
    check_reward_config(config.worker.reward)
    for message in config_warnings(config):
        print(f"easyr1 config: warning: {message}", file=sys.stderr)
    sys.stdout.write(config.to_yaml())
    return 0


def _cmd_train(args: list[str]) -> int:
    """Train with ``config=FILE.yaml key=value ...`` on ``trainer.n_gpus_per_node`` local ranks."""
    from easyr1.hub import modelscope_overrides
    from easyr1.launch.local import launch

    if _config_help("train", args):
        return 0
    args = args + modelscope_overrides(load_config(args))  # USE_MODELSCOPE_HUB=1: hub names as local copies
    return launch(load_config(args), args)


def _tiny_model_parser() -> argparse.ArgumentParser:
    from easyr1.models.tiny import ARCHS, SIZES

    parser = argparse.ArgumentParser(
        prog="easyr1 tiny-model", description="Build a tiny offline model folder."
    )
    parser.add_argument("--arch", required=True, choices=ARCHS)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    sizes = ", ".join(f"{arch} {size}" for arch, size in SIZES)
    parser.add_argument(
        "--size", default="tiny", help=f"tiny, or a real family's size for benchmarks ({sizes})"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the weights are initialised (cuda: minutes faster at real sizes; each device gives its own reproducible weights)",
    )
    parser.add_argument(
        "--no-weights",
        dest="weights",
        action="store_false",
        help="no weight files: config, tokenizer and processor only (for easyr1 bench --simulated-ranks)",
    )
    return parser


def _cmd_tiny_model(args: list[str]) -> int:
    from easyr1.models.tiny import build_tiny_model

    ns = _tiny_model_parser().parse_args(args)
    print(build_tiny_model(ns.arch, ns.out, seed=ns.seed, size=ns.size, device=ns.device, weights=ns.weights))
    return 0


def _make_data_parser() -> argparse.ArgumentParser:
    from easyr1.data.synthetic import TASKS

    parser = argparse.ArgumentParser(
        prog="easyr1 make-data", description="Write a synthetic task in EasyR1's format."
    )
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--train", type=int, default=512, help="rows in the train split")
    parser.add_argument("--test", type=int, default=128, help="rows in the test split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    parser.add_argument(
        "--difficulty",
        type=int,
        default=1,
        help="arithmetic: operands below 10**difficulty; compare: numbers of that many digits",
    )
    parser.add_argument(
        "--image-size", type=int, default=56, help="image tasks: side of each image in pixels"
    )
    return parser


def _cmd_make_data(args: list[str]) -> int:
    from easyr1.data.synthetic import write_task

    ns = _make_data_parser().parse_args(args)
    splits = write_task(
        ns.task,
        ns.out,
        ns.train,
        ns.test,
        seed=ns.seed,
        fmt=ns.format,
        difficulty=ns.difficulty,
        image_size=ns.image_size,
    )
    for split, path in splits.items():
        print(f"{split}: {path}")
    return 0


def _warm_start_parser() -> argparse.ArgumentParser:
    from easyr1.models.warmstart import add_arguments

    parser = argparse.ArgumentParser(
        prog="easyr1 warm-start",
        description="A short supervised pass on a task's answer format, so RL starts from a model that follows it.",
    )
    add_arguments(parser)
    return parser


def _cmd_warm_start(args: list[str]) -> int:
    from easyr1.models.warmstart import run_from_args

    return run_from_args(_warm_start_parser().parse_args(args))


def _cmd_bench(args: list[str]) -> int:
    from easyr1.bench import main as bench_main

    return bench_main(args)


def _memory_module(args: list[str]) -> ModuleType:
    """The module of ``easyr1 memory ARGS``: ``--measure`` runs rank 0 of the job here, a module above
    the estimator."""
    if "--measure" in args:
        from easyr1 import memory_measure

        return memory_measure
    from easyr1 import memory_cli

    return memory_cli


def _cmd_memory(args: list[str]) -> int:
    return _memory_module(args).main(args)


def _cmd_demo(args: list[str]) -> int:
    from easyr1.demo import main as demo_main

    return demo_main(args)


def _version_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog="easyr1 version", description=_cmd_version.__doc__)


def _cmd_version(args: list[str]) -> int:
    """The engine's fingerprint, git revision and package versions, as JSON (what records cite)."""
    import json

    from easyr1.provenance import describe

    _version_parser().parse_args(args)
    print(json.dumps(describe(), sort_keys=True))
    return 0


def _merge_parser() -> argparse.ArgumentParser:
    from easyr1.workers.fsdp import DTYPES

    parser = argparse.ArgumentParser(
        prog="easyr1 merge", description="Merge a sharded checkpoint into a Hugging Face model folder."
    )
    parser.add_argument(
        "--local_dir", "--local-dir", required=True, type=Path, help="a checkpoint's .../global_step_N/actor"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="default: LOCAL_DIR/huggingface (LOCAL_DIR/lora_adapter)"
    )
    parser.add_argument(
        "--lora-adapter", "--lora_adapter", action="store_true", help="save LoRA weights as a peft adapter"
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default=None, help="cast the weights (default: as trained)"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="then load the folder with from_pretrained and check every tensor is as saved",
    )
    return parser


def _cmd_merge(args: list[str]) -> int:
    """Merge ``global_step_N/actor`` (DCP shards) into a Hugging Face folder; no process group needed."""
    from easyr1.checkpoint import CheckpointError
    from easyr1.export import merge_checkpoint
    from easyr1.workers.fsdp import DTYPES

    ns = _merge_parser().parse_args(args)
    dtype = DTYPES[ns.dtype] if ns.dtype else None
    try:
        print(
            merge_checkpoint(
                ns.local_dir, ns.output, lora_adapter=ns.lora_adapter, dtype=dtype, verify=ns.verify
            )
        )
        if ns.verify:
            print("verified: from_pretrained loads the folder with every tensor as merged")
    except CheckpointError as exc:
        print(f"easyr1 merge: {exc}", file=sys.stderr)
        return 1
    return 0


COMMANDS = {  # name: (function, what it does)
    "train": (
        _cmd_train,
        "Train: GRPO and its relatives, on this machine's GPUs (or CPUs), under torchrun, srun or Ray.",
    ),
    "config": (_cmd_config, "Print the resolved config as YAML after the checks `train` runs."),
    "memory": (_cmd_memory, "Predict a run's peak GPU memory per phase and term, and the GPUs it needs."),
    "merge": (_cmd_merge, "Merge a sharded checkpoint into a Hugging Face model folder (or a LoRA adapter)."),
    "tiny-model": (_cmd_tiny_model, "Build a tiny (or a real-size, random-init) model folder offline."),
    "make-data": (
        _cmd_make_data,
        "Write a synthetic task (arithmetic, comparisons, images) in EasyR1's data format.",
    ),
    "warm-start": (_cmd_warm_start, "A short supervised pass on a task's answer format, before RL."),
    "bench": (_cmd_bench, "Benchmark a named workload (GPU), optionally beside TRL; writes JSON."),
    "demo": (_cmd_demo, "A short GRPO run on a tiny model on this machine's CPU, end to end."),
    "version": (_cmd_version, "The engine's fingerprint, git revision and package versions, as JSON."),
}


def flag_parser(command: str, args: list[str]) -> argparse.ArgumentParser | None:
    """The argparse parser ``easyr1 COMMAND ARGS`` reads its flags with, to read a command line without
    running it (tests/harness/test_readme.py checks the README's commands so). None for the config
    commands (train, config), whose arguments are all ``config=FILE.yaml KEY=VALUE``; ``memory`` leaves
    such arguments to its parser's ``parse_known_args``, ``bench`` takes them as ``overrides``."""
    if command not in COMMANDS:
        raise KeyError(f"unknown command {command!r}; choose one of {', '.join(COMMANDS)}")
    if command in ("train", "config"):
        return None
    if command == "memory":
        return _memory_module(args).build_parser()
    if command == "bench":
        from easyr1.bench import build_parser
    elif command == "demo":
        from easyr1.demo import build_parser
    else:
        build_parser = {
            "tiny-model": _tiny_model_parser,
            "make-data": _make_data_parser,
            "warm-start": _warm_start_parser,
            "merge": _merge_parser,
            "version": _version_parser,
        }[command]
    return build_parser()


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: easyr1 COMMAND [ARGS ...]   (easyr1 COMMAND --help: its arguments)", "", "commands:"]
    return "\n".join(lines + [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"easyr1: unknown command {command!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[command][0](rest)
    except ConfigError as exc:
        print(f"easyr1 {command}: config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
