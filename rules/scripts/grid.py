"""The matrix's grid expanded into cells.

A cell is one training run, ``runs/{cell}/``, named {model}-{algorithm}-{dataset}-{precision} (plus
-lora{r}, -{n}gpu, -seed{s} where those differ from the matrix's defaults). Its engine config is the
matrix's engine file with the data set's, model's, algorithm's and precision's overrides on top,
then the keys the harness sets (paths, steps, ranks, seed); the hash of that resolved config (and of
its environment) is the cell's key. Each cell's config is checked as ``easyr1 train`` will check it,
so that a typo stops the matrix before any cell runs.
"""

from __future__ import annotations

import functools
from itertools import product
from typing import Any

from snakemake.logging import logger

from easyr1.config import ConfigError, from_tree, read_yaml
from easyr1.config_checks import check_config
from rules.scripts.environments import Environment, cell_environment, environment_key, environment_label
from rules.scripts.matrix import Matrix, merged, nested, repo_file, short_hash
from rules.scripts.sources import has_images, is_vision, local_columns, model_path, splits


def read_engine(matrix: Matrix) -> None:
    """The engine config every cell starts from (``engine:``), read into the matrix, and the image
    preparation runs in (environment apptainer)."""
    config = matrix.config
    matrix.engine_file = repo_file(matrix, "engine", config["engine"])
    try:
        matrix.base = read_yaml(matrix.engine_file)
    except ConfigError as exc:
        raise matrix.error("engine", str(exc)) from None
    if config["environment"] == "apptainer" and "image" not in config:
        raise matrix.error("image", "environment apptainer needs an image: preparation runs in the matrix's")
    matrix.prepare_image = config.get("image") if config["environment"] == "apptainer" else None


def reward_spec(matrix: Matrix, key: str, reward: str) -> str:
    """Built-in reward names pass through; a path/file.py:function is resolved in the repository."""
    if ":" not in reward:
        return reward
    path, function = reward.rsplit(":", 1)
    return f"{repo_file(matrix, key, path)}:{function}"


def cell_name(
    config: dict[str, Any],
    model: str,
    algorithm: str,
    dataset: str,
    precision: str,
    lora: int,
    gpus: int,
    seed: int,
    nnodes: int,
    launcher: str,
) -> str:
    name = f"{model}-{algorithm}-{dataset}-{precision}"
    if lora:
        name += f"-lora{lora}"
    if gpus != config["gpus"]:
        name += f"-{gpus}gpu"
    if nnodes != max(1, gpus // config["gpus_per_node"]):  # not the nodes its GPUs fill
        name += f"-{nnodes}node"
    if nnodes > 1 and launcher != config["launcher"]:
        name += f"-{launcher}"
    if seed != config["seed"]:
        name += f"-seed{seed}"
    return name


def topology(matrix: Matrix, key: str, gpus: int, nodes: int | None) -> tuple[int, int]:
    """(nnodes, ranks per node) of a cell with this many GPUs (0: CPU ranks) over ``nodes``
    machines (None: as many as the GPUs fill, one for CPU ranks); ``key`` names the block in errors."""
    config = matrix.config
    ranks = gpus or config["cpu_ranks"]
    if nodes is None:
        if gpus == 0:
            return 1, ranks
        per_node = config["gpus_per_node"]
        if gpus > per_node and gpus % per_node:
            raise matrix.error(f"{key}.gpus", f"{gpus} GPUs do not fill nodes of {per_node}")
        return max(1, gpus // per_node), min(gpus, per_node)
    what = f"{gpus} GPUs" if gpus else f"cpu_ranks {ranks}"
    if ranks % nodes:
        raise matrix.error(f"{key}.nodes", f"{what} do not split evenly over {nodes} nodes")
    if gpus and gpus // nodes > config["gpus_per_node"]:
        raise matrix.error(
            f"{key}.nodes",
            f"{what} over {nodes} nodes is {gpus // nodes} a node; gpus_per_node is {config['gpus_per_node']}",
        )
    return nodes, ranks // nodes


def cell_resources(
    config: dict[str, Any], model: str, gpus: int, nnodes: int, per_node: int, launcher: str
) -> dict[str, Any]:
    """Resources of a train job, in the names the SLURM executor plugin reads (mem_mb per node).

    ``threads`` are a node's: the engine splits them over the node's ranks. A cell of several
    nodes asks SLURM for its tasks: with ``srun``, one task a rank (``mpi``: the job runs in the
    batch script, whose ``srun`` starts the ranks); with ``ray``, one task a node, in which the
    engine starts Ray's head and workers. Its GPUs are asked for per node (``gres``).
    """
    res = {**config["resources"], **config["models"][model].get("resources", {})}
    cpus_per_gpu = res.get("cpus_per_gpu", 8)
    threads = per_node * cpus_per_gpu if gpus else per_node
    several = nnodes > 1
    by_rank = several and launcher == "srun"
    return {
        "threads": threads,
        "mem_mb": res.get("mem_mb", 8000),
        "runtime": res.get("runtime", 60),
        "gpu": 0 if several else gpus,
        "gres": f"gpu:{per_node}" if several and gpus else "",
        "cpus_per_gpu": cpus_per_gpu,
        "nodes": nnodes,
        "mpi": "srun" if by_rank else "",
        "tasks": (nnodes * per_node if by_rank else nnodes) if several else 0,
        "tasks_per_gpu": 1 if by_rank and gpus else 0,
        "cpus_per_task": (threads // per_node if by_rank else threads) if several else 0,
        "slurm_extra": "--ntasks-per-node=1" if several and gpus and not by_rank else "",
    }


@functools.cache
def engine_file_error(matrix: Matrix, world: int) -> str:
    """What the engine file alone fails with on ``world`` ranks ("" when nothing): a cell's error
    that the file alone has too is the file's, and names it rather than the cell."""
    try:
        check_config(from_tree(matrix.base), world)
    except ConfigError as exc:
        return str(exc)
    return ""


def make_cell(
    matrix: Matrix,
    key: str,
    model: str,
    algorithm: str,
    dataset: str,
    precision: str,
    lora: int,
    gpus: int,
    seed: int,
    nodes: int | None,
    launcher: str,
    env: Environment,
) -> dict[str, Any]:
    """One cell: its axes, its environment ``env`` = (environment, image, venv), resolved config and
    hash (``key`` names its grid block in errors)."""
    config = matrix.config
    _, image, venv = env
    here = image is None  # a native or virtualenv cell reads this machine's files
    nnodes, per_node = topology(matrix, key, gpus, nodes)
    if nnodes > 1 and launcher == "ray" and image is not None:
        raise matrix.error(
            key,
            f"{model}: launcher ray does not run in an Apptainer image: the engine starts its Ray workers "
            "on the other nodes with srun from inside the run, and an image has no SLURM client; "
            "use launcher: srun (a task a rank, each in the image)",
        )
    name = cell_name(config, model, algorithm, dataset, precision, lora, gpus, seed, nnodes, launcher)
    data = config["datasets"][dataset]
    train, test = splits(matrix, dataset, here)
    harness_keys = {
        "data.train_files": train,
        "data.val_files": test,
        "data.seed": seed,
        "worker.rollout.seed": seed,
        "worker.actor.model.model_path": model_path(matrix, model, here),
        "worker.reward.reward_function": reward_spec(matrix, f"datasets.{dataset}.reward", data["reward"]),
        "trainer.max_steps": data.get("steps", config["steps"]),
        "trainer.nnodes": nnodes,
        "trainer.n_gpus_per_node": per_node,
        "trainer.experiment_name": name,
        "trainer.save_checkpoint_path": f"runs/{name}",
    }
    if "format_prompt" in data:
        harness_keys["data.format_prompt"] = repo_file(
            matrix, f"datasets.{dataset}.format_prompt", data["format_prompt"]
        )
    if lora:
        harness_keys["worker.actor.model.lora.rank"] = lora
    engine_config = matrix.base
    for overrides in (
        data["overrides"],
        config["models"][model]["overrides"],
        config["algorithms"][algorithm],
        config["precisions"][precision],
        harness_keys,
    ):
        engine_config = merged(engine_config, nested(overrides))
    try:  # as `easyr1 train` will check it, so that a typo stops the matrix before any cell runs
        checked = from_tree(engine_config)
        check_config(checked, nnodes * per_node)
    except ConfigError as exc:
        if str(exc) == engine_file_error(matrix, nnodes * per_node):
            raise matrix.error("engine", f"{matrix.engine_file}: {exc}") from None
        raise matrix.error(key, f"{name}: {exc}") from None
    if "synthetic" not in data:
        for split, path in (("train", train), ("test", test)):
            columns = {"data.prompt_key": checked.data.prompt_key, "data.answer_key": checked.data.answer_key}
            local_columns(matrix, f"datasets.{dataset}.{split}", path, columns)
    return {
        "name": name,
        "model": model,
        "size": config["models"][model].get("size", ""),
        "algorithm": algorithm,
        "dataset": dataset,
        "precision": precision,
        "lora": lora,
        "gpus": gpus,
        "seed": seed,
        "steps": harness_keys["trainer.max_steps"],
        "environment": environment_label(env),
        "image": image,
        **({"venv": venv} if venv else {}),
        "nodes": nnodes,
        "launcher": launcher if nnodes > 1 else "local",
        "hash": short_hash(
            matrix,
            {
                "config": engine_config,
                "environment": environment_key(env),
                # how ranks start on several nodes (one node's cells keep the hash they had)
                **({"launcher": launcher} if nnodes > 1 else {}),
            },
        ),
        "config": engine_config,
        "resources": cell_resources(config, model, gpus, nnodes, per_node, launcher),
    }


def expand_grid(matrix: Matrix) -> dict[str, dict[str, Any]]:
    """All cells of the grid's blocks (name -> spec), minus the nonsense ones (a text-only model on
    images), which it names in the log."""
    config = matrix.config
    cells, environments, excluded = {}, {}, set()
    for index, block in enumerate(config["grid"]):
        for axis in ("models", "algorithms", "datasets", "precisions"):
            for value in block[axis]:
                if value not in config[axis]:
                    known = ", ".join(config[axis])
                    raise matrix.error(
                        f"grid[{index}].{axis}", f"unknown {axis[:-1]} {value!r}; defined: {known}"
                    )
        launcher = block.get("launcher", config["launcher"])
        for model, algorithm, dataset, precision, lora, gpus, seed, nodes in product(
            block["models"],
            block["algorithms"],
            block["datasets"],
            block["precisions"],
            block.get("lora", [0]),
            block.get("gpus", [config["gpus"]]),
            block.get("seeds", [config["seed"]]),
            block.get("nodes", [None]),
        ):
            if has_images(config, dataset) and not is_vision(config, model):
                excluded.add(f"{model}-{dataset}")
                continue
            env = cell_environment(matrix, f"grid[{index}]", model, block)
            key = f"grid[{index}]"
            spec = make_cell(
                matrix, key, model, algorithm, dataset, precision, lora, gpus, seed, nodes, launcher, env
            )
            earlier = environments.get(spec["name"])
            if earlier is not None and earlier != environment_key(env):
                raise matrix.error(key, f"{spec['name']} is in an earlier block too, in another environment")
            cells[spec["name"]] = spec
            environments[spec["name"]] = environment_key(env)
    if excluded:
        logger.info(f"matrix: left out text-only model x image data set: {', '.join(sorted(excluded))}")
    if not cells:
        raise matrix.error(
            "grid", "no cells: every model of the grid is text-only and every data set has images"
        )
    return cells
