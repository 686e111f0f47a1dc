# The matrix: validate the config, expand its grid into cells, and name what each cell needs.
#
# A cell is one training run, `runs/{cell}/`, named {model}-{algorithm}-{dataset}-{precision}
# (plus -lora{r}, -{n}gpu, -seed{s} where those differ from the matrix's defaults). Its engine
# config is the matrix's engine file with the data set's, model's, algorithm's and precision's
# overrides on top, then the keys the harness sets (paths, steps, ranks, seed). The hash of that
# resolved config is the cell's key: it is a param of the train rule, so changing one axis
# reruns exactly the cells whose config changed. The engine's fingerprint (a hash of its source,
# as `easyr1 version` reports it) is a param too: a cell reruns when the engine it would run with
# is not the one it ran with.
#
# A cell runs in an environment (rules/scripts/engine.py): native, an Apptainer image that its
# rules name with `container:`, so that Snakemake pulls it and hands each job its local copy, or a
# dependency combination's virtualenv (`venv`), which the venv rule builds into the cache that
# `make deps` builds into too (rules/scripts/deps.py) and whose record is an input of its cells.
# Preparation runs in the matrix's environment, a cell in its grid block's, model's or matrix's.

import copy
import functools
import hashlib
import json
import shlex
from difflib import get_close_matches
from glob import glob
from itertools import product
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.settings.types import DeploymentMethod

from easyr1.config import ConfigError, from_tree, read_yaml
from easyr1.config_checks import check_config
from easyr1.data.paths import names_a_local_path, split_path
from rules.scripts import cell as cell_jobs, deps, engine
from rules.scripts.collect import collect, summary
from rules.scripts.inputs import check_columns, check_schema, check_unique_keys, recorded_files

try:
    check_unique_keys(workflow.configfiles)
except ConfigError as exc:
    raise WorkflowError(f"matrix config: {exc}") from None
# Keys given on the command line (--config KEY=VALUE): an error in one is not the matrix file's.
COMMAND_LINE = dict(workflow.config_settings.config or {})


def from_command_line(key, message=""):
    """The end of an error, ``(KEY came from --config, ...)``, when the config key ``key``
    (``grid[0].models``: its top key), or a key that ``message`` quotes, was given on the command
    line; "" otherwise."""
    top = key.split(".")[0].split("[")[0]
    given = top if top in COMMAND_LINE else next((k for k in COMMAND_LINE if f"'{k}'" in message), None)
    return f" ({given} came from --config, not from the file)" if given else ""


try:
    check_schema(config, REPO / "configs/schema/matrix.schema.yaml")
except ConfigError as exc:
    where = str(exc).split(": ", 1)[0]
    raise WorkflowError(f"matrix config {MATRIX_FILE}: {exc}{from_command_line(where, str(exc))}") from None

VISION_ARCHS = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}
# Tasks with images or videos: a text-only model is left out of their cells.
IMAGE_TASKS = {"count_shapes", "multi_image", "mixed", "dominant_color", "moving_bar", "fading", "mixed_media"}
PREPARED = "runs/prepared"


def matrix_error(key, message):
    return WorkflowError(f"matrix config {MATRIX_FILE}: {key}: {message}{from_command_line(key)}")


# What a cell's hash knows of each repository file the harness resolved (repo_file): its path in
# the repository (or, outside it, its absolute path) and its content's digest.
REPO_FILES = {}


def repo_file(key, path):
    """A file of the repository (engine config, format prompt, reward file), as an absolute path:
    the engine reads it from the working directory."""
    full = REPO / path
    if not full.is_file():
        raise matrix_error(key, f"file not found: {full}")
    digest = hashlib.sha256(full.read_bytes()).hexdigest()[:12]
    place = full.relative_to(REPO) if full.is_relative_to(REPO) else full
    REPO_FILES[str(full)] = f"{place}@{digest}"
    return str(full)


def portable(value):
    """``value`` as a hash should see it: a file ``repo_file`` resolved (a reward function's
    ``path:function`` too) becomes its place in the repository and its content's digest. So the
    same checkout reached through another path (a symlink, a relative ``-s``, a moved clone) keeps
    its cells, whose runs a changed hash would replace, and an edited reward file reruns them."""
    if isinstance(value, dict):
        return {key: portable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [portable(item) for item in value]
    if isinstance(value, str):
        path, colon, function = value.rpartition(":") if ":" in value else (value, "", "")
        if path in REPO_FILES:
            return f"{REPO_FILES[path]}{colon}{function}"
        if value in REPO_FILES:
            return REPO_FILES[value]
    return value


def nested(dotted):
    """{"a.b": 1} -> {"a": {"b": 1}}."""
    tree = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def merged(base, extra):
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def short_hash(value):
    return hashlib.sha256(
        json.dumps(portable(value), sort_keys=True).encode()
    ).hexdigest()[:12]


def reward_spec(key, reward):
    """Built-in reward names pass through; a path/file.py:function is resolved in the repository."""
    if ":" not in reward:
        return reward
    path, function = reward.rsplit(":", 1)
    return f"{repo_file(key, path)}:{function}"


def is_vision(name):
    model = config["models"][name]
    return model.get("tiny") in VISION_ARCHS or model.get("vision", False)


def has_images(name):
    dataset = config["datasets"][name]
    synthetic = dataset.get("synthetic")
    return synthetic["task"] in IMAGE_TASKS if synthetic else dataset["images"]


def data_dir(name):
    """Where a synthetic data set is written; the name carries everything that defines it."""
    s = config["datasets"][name]["synthetic"]
    return f"{PREPARED}/data/{s['task']}-d{s['difficulty']}-{s['train']}-{s['test']}-s{s['seed']}"


def local_source(key, value, here):
    """A data set or model as the engine will load it: a path that can only be local
    (``names_a_local_path``: a data file's name, from /, ~ or ., or of three parts or more) must
    exist, or every cell would fail after preparation. A relative one is read from the working
    directory; an absolute one is checked where the job reading it runs on this machine's files
    (``here``: natively or in a virtualenv, on this machine or on a cluster's shared file system),
    and left to the job in an image, where it may be the image's own or bound from elsewhere."""
    path, _ = split_path(value)
    full = Path(path).expanduser()
    if not names_a_local_path(path) or (full.is_absolute() and not here) or full.exists():
        return value
    where = (
        "a job outside an image reads an absolute path from this machine's files"
        if full.is_absolute()
        else f"local paths are read from the working directory, {Path.cwd()}"
    )
    raise matrix_error(key, f"{value}: no such file or folder ({where})")


def local_columns(key, value, needed):
    """A local data file's columns must hold ``needed`` (config key -> column): checked from its
    first row (``check_columns``), before any job, where the engine would fail inside every one."""
    path = Path(split_path(value)[0]).expanduser()
    if not path.is_file():
        return
    try:
        check_columns(path, needed)
    except ConfigError as exc:
        raise matrix_error(key, f"{value}: {exc}") from None


def splits(name, here=True):
    """A data set's (train, test) as the engine loads them (``here``: see ``local_source``)."""
    dataset = config["datasets"][name]
    if "synthetic" in dataset:
        return f"{data_dir(name)}@train", f"{data_dir(name)}@test"
    return tuple(
        local_source(f"datasets.{name}.{split}", dataset[split], here)
        for split in ("train", "test")
    )


def data_view(name):
    """The engine's data.* keys as the base config and the data set's overrides set them."""
    return merged(
        BASE.get("data", {}),
        nested(config["datasets"][name]["overrides"]).get("data", {}),
    )


def warm_start_spec(name):
    """Everything that defines a model's warm start; its hash names the folder it is cached in."""
    model = config["models"][name]
    warm = model["warm_start"]
    dataset_name = warm["dataset"]
    if dataset_name not in config["datasets"]:
        raise matrix_error(
            f"models.{name}.warm_start.dataset", f"unknown data set {dataset_name!r}"
        )
    if has_images(dataset_name) and not is_vision(name):
        raise matrix_error(
            f"models.{name}.warm_start.dataset",
            f"{dataset_name} has images; {name} is text-only",
        )
    dataset = config["datasets"][dataset_name]
    data = data_view(dataset_name)
    spec = {
        "model": built_model_dir(name),
        "data": splits(dataset_name, PREPARE_IMAGE is None)[0],
        "answer_format": dataset["answer_format"],
        "prompt_key": data.get("prompt_key", "problem"),
        "answer_key": warm.get("answer_key", data.get("answer_key", "answer")),
        "max_prompt_length": data.get("max_prompt_length", 256),
        "steps": warm["steps"],
        "batch_size": warm["batch_size"],
        "lr": warm["lr"],
    }
    if "synthetic" not in dataset:
        local_columns(
            f"datasets.{dataset_name}.train",
            spec["data"],
            {"data.prompt_key": spec["prompt_key"], f"models.{name}.warm_start.answer_key": spec["answer_key"]}
            if "answer_key" in warm
            else {"data.prompt_key": spec["prompt_key"], "data.answer_key": spec["answer_key"]},
        )
    for bound in ("min_pixels", "max_pixels"):  # the images as the RL run will see them
        if has_images(dataset_name) and bound in data:
            spec[bound] = "none" if data[bound] is None else data[bound]
    if "format_prompt" in dataset:
        spec["format_prompt"] = repo_file(
            f"datasets.{dataset_name}.format_prompt", dataset["format_prompt"]
        )
    return spec


def warm_start_dir(name):
    return f"{PREPARED}/warm/{name}-{short_hash(warm_start_spec(name))}"


def built_model_dir(name):
    """The folder the harness builds a ``tiny`` model in: ``{arch}``, or ``{arch}-{scale}`` for the
    architecture at a real family's size (random-init: what memory and speed are at that size;
    the engine's ``tiny-model --size`` refuses a size it does not know, naming the ones it does)."""
    model = config["models"][name]
    suffix = f"-{model['scale']}" if "scale" in model else ""
    return f"{PREPARED}/model/{model['tiny']}{suffix}"


def model_path(name, here=True):
    """Where a cell finds model ``name`` (``here``: see ``local_source``)."""
    model = config["models"][name]
    if "path" in model:
        return local_source(f"models.{name}.path", model["path"], here)
    return warm_start_dir(name) if "warm_start" in model else built_model_dir(name)


def cell_name(model, algorithm, dataset, precision, lora, gpus, seed, nnodes, launcher):
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


def topology(key, gpus, nodes):
    """(nnodes, ranks per node) of a cell with this many GPUs (0: CPU ranks) over ``nodes``
    machines (None: as many as the GPUs fill, one for CPU ranks); ``key`` names the block in errors."""
    ranks = gpus or config["cpu_ranks"]
    if nodes is None:
        if gpus == 0:
            return 1, ranks
        per_node = config["gpus_per_node"]
        if gpus > per_node and gpus % per_node:
            raise matrix_error(f"{key}.gpus", f"{gpus} GPUs do not fill nodes of {per_node}")
        return max(1, gpus // per_node), min(gpus, per_node)
    what = f"{gpus} GPUs" if gpus else f"cpu_ranks {ranks}"
    if ranks % nodes:
        raise matrix_error(f"{key}.nodes", f"{what} do not split evenly over {nodes} nodes")
    if gpus and gpus // nodes > config["gpus_per_node"]:
        raise matrix_error(
            f"{key}.nodes",
            f"{what} over {nodes} nodes is {gpus // nodes} a node; gpus_per_node is {config['gpus_per_node']}",
        )
    return nodes, ranks // nodes


def cell_resources(model, gpus, nnodes, per_node, launcher):
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


# Dependency matrix files that venv cells name, as loaded (file -> matrix), and the install spec of
# each combination they use (its key -> spec), for the venv rule.
DEPS_FILES = {}
VENV_SPECS = {}


def venv_combination(layers, error):
    """The dependency combination of ``environment: venv``: ``{file, combination, key}``, each of
    ``deps:``'s keys from the first of ``layers`` ((key prefix, block)) that sets it; ``key`` is the
    hash of what its virtualenv installs (deps.env_key). ``error(field)`` is the error for a key
    that no layer sets."""
    found = {}
    for field in ("file", "combination"):
        found[field] = next(
            (
                (f"{prefix}deps.{field}", layer["deps"][field])
                for prefix, layer in layers
                if field in layer.get("deps", {})
            ),
            None,
        )
        if found[field] is None:
            raise error(field)
    (file_key, file), (name_key, name) = found["file"], found["combination"]
    if file not in DEPS_FILES:
        DEPS_FILES[file] = deps.load(repo_file(file_key, file))
    combinations = DEPS_FILES[file]["combinations"]
    if name not in combinations:
        raise matrix_error(
            name_key,
            f"unknown combination {name!r} in {file}; defined: {', '.join(combinations)}",
        )
    spec = deps.spec(DEPS_FILES[file], name)
    key = deps.env_key(spec)
    VENV_SPECS[key] = spec
    return {"file": file, "combination": name, "key": key}


def cell_environment(key, model, block):
    """(environment, image, venv) of a grid block's cells of ``model``: each from the block, else the
    model, else the matrix (``key`` names the block in errors); image for apptainer, venv (see
    ``venv_combination``) for venv, else None."""
    layers = ((f"{key}.", block), (f"models.{model}.", config["models"][model]), ("", config))
    environment = next(
        layer["environment"] for _, layer in layers if "environment" in layer
    )
    if environment == "native":
        return environment, None, None
    if environment == "venv":
        venv = venv_combination(
            layers,
            lambda field: matrix_error(
                key,
                f"{model}: environment venv needs deps.{field} (deps: on the block, model or matrix)",
            ),
        )
        return environment, None, venv
    image = next((layer["image"] for _, layer in layers if "image" in layer), None)
    if image is None:
        raise matrix_error(
            key,
            f"{model}: environment apptainer needs an image (image: on the block, model or matrix)",
        )
    return environment, image, None


def environment_key(env):
    """What a cell's hash knows of its environment ``env`` = (environment, image, venv): a native
    cell's hash is what it always was; a venv cell's knows its combination and what it installs."""
    environment, image, venv = env
    if venv is not None:
        return f"venv {venv['combination']} {venv['key']}"
    return environment if image is None else f"{environment} {image}"


def environment_label(env):
    """How results.csv names the environment: native, apptainer (its image has a column), or venv
    with its combination's name."""
    environment, _, venv = env
    return environment if venv is None else f"venv {venv['combination']}"


def venv_record(venv):
    """The venv rule's record of a combination's virtualenv (where it is, what it has)."""
    return f"{PREPARED}/venv/{venv['combination']}-{venv['key']}.json"


def make_cell(key, model, algorithm, dataset, precision, lora, gpus, seed, nodes, launcher, env):
    """One cell: its axes, its environment ``env`` = (environment, image, venv), resolved config and
    hash (``key`` names its grid block in errors)."""
    _, image, venv = env
    here = image is None  # a native or virtualenv cell reads this machine's files
    nnodes, per_node = topology(key, gpus, nodes)
    if nnodes > 1 and launcher == "ray" and image is not None:
        raise matrix_error(
            key,
            f"{model}: launcher ray does not run in an Apptainer image: the engine starts its Ray workers "
            "on the other nodes with srun from inside the run, and an image has no SLURM client; "
            "use launcher: srun (a task a rank, each in the image)",
        )
    name = cell_name(model, algorithm, dataset, precision, lora, gpus, seed, nnodes, launcher)
    data = config["datasets"][dataset]
    train, test = splits(dataset, here)
    harness_keys = {
        "data.train_files": train,
        "data.val_files": test,
        "data.seed": seed,
        "worker.rollout.seed": seed,
        "worker.actor.model.model_path": model_path(model, here),
        "worker.reward.reward_function": reward_spec(
            f"datasets.{dataset}.reward", data["reward"]
        ),
        "trainer.max_steps": data.get("steps", config["steps"]),
        "trainer.nnodes": nnodes,
        "trainer.n_gpus_per_node": per_node,
        "trainer.experiment_name": name,
        "trainer.save_checkpoint_path": f"runs/{name}",
    }
    if "format_prompt" in data:
        harness_keys["data.format_prompt"] = repo_file(
            f"datasets.{dataset}.format_prompt", data["format_prompt"]
        )
    if lora:
        harness_keys["worker.actor.model.lora.rank"] = lora
    engine_config = BASE
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
        if str(exc) == engine_file_error(nnodes * per_node):
            raise matrix_error("engine", f"{ENGINE_FILE}: {exc}") from None
        raise matrix_error(key, f"{name}: {exc}") from None
    if "synthetic" not in data:
        for split, path in (("train", train), ("test", test)):
            columns = {"data.prompt_key": checked.data.prompt_key, "data.answer_key": checked.data.answer_key}
            local_columns(f"datasets.{dataset}.{split}", path, columns)
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
            {
                "config": engine_config,
                "environment": environment_key(env),
                # how ranks start on several nodes (one node's cells keep the hash they had)
                **({"launcher": launcher} if nnodes > 1 else {}),
            }
        ),
        "config": engine_config,
        "resources": cell_resources(model, gpus, nnodes, per_node, launcher),
    }


@functools.cache
def engine_file_error(world):
    """What the engine file alone fails with on ``world`` ranks ("" when nothing): a cell's error
    that the file alone has too is the file's, and names it rather than the cell."""
    try:
        check_config(from_tree(BASE), world)
    except ConfigError as exc:
        return str(exc)
    return ""


def expand_grid():
    """All cells of the grid's blocks, minus the nonsense ones (a text-only model on images)."""
    cells, environments, excluded = {}, {}, set()
    for index, block in enumerate(config["grid"]):
        for axis in ("models", "algorithms", "datasets", "precisions"):
            for value in block[axis]:
                if value not in config[axis]:
                    known = ", ".join(config[axis])
                    raise matrix_error(
                        f"grid[{index}].{axis}",
                        f"unknown {axis[:-1]} {value!r}; defined: {known}",
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
            if has_images(dataset) and not is_vision(model):
                excluded.add(f"{model}-{dataset}")
                continue
            env = cell_environment(f"grid[{index}]", model, block)
            spec = make_cell(
                f"grid[{index}]",
                model,
                algorithm,
                dataset,
                precision,
                lora,
                gpus,
                seed,
                nodes,
                launcher,
                env,
            )
            earlier = environments.get(spec["name"])
            if earlier is not None and earlier != environment_key(env):
                raise matrix_error(
                    f"grid[{index}]",
                    f"{spec['name']} is in an earlier block too, in another environment",
                )
            cells[spec["name"]] = spec
            environments[spec["name"]] = environment_key(env)
    if excluded:
        logger.info(
            f"matrix: left out text-only model x image data set: {', '.join(sorted(excluded))}"
        )
    if not cells:
        raise matrix_error(
            "grid", "no cells: every model of the grid is text-only and every data set has images"
        )
    return cells


# The engine every environment runs: the one this interpreter imports.
ENGINE = engine.describe()
ENGINE_FILE = repo_file("engine", config["engine"])
try:
    BASE = read_yaml(ENGINE_FILE)
except ConfigError as exc:
    raise matrix_error("engine", str(exc)) from None
if config["environment"] == "apptainer" and "image" not in config:
    raise matrix_error(
        "image",
        "environment apptainer needs an image: preparation runs in the matrix's",
    )
PREPARE_IMAGE = config.get("image") if config["environment"] == "apptainer" else None
PREPARE_VENV = (
    venv_combination(
        (("", config),),
        lambda field: matrix_error(
            f"deps.{field}",
            "environment venv needs a dependency combination (deps: {file: ..., combination: ...}): "
            "preparation runs in the matrix's",
        ),
    )
    if config["environment"] == "venv"
    else None
)
CELLS = expand_grid()
WARM_STARTS = {
    warm_start_dir(m): warm_start_spec(m)
    for m in config["models"]
    if "warm_start" in config["models"][m]
}
SYNTHETIC = {
    data_dir(d): config["datasets"][d]["synthetic"]
    for d in config["datasets"]
    if "synthetic" in config["datasets"][d]
}
try:
    RECORDED = recorded_files(config["recorded"], REPO, (".json", "results.csv"))
except ConfigError as exc:
    raise matrix_error("recorded", str(exc)) from None
# A recorded CPU run (baselines/cpu/{date}-{revision}/results.csv) keeps its curves beside it.
RECORDED_CURVES = [
    str(Path(f).with_name("curves.csv"))
    for f in RECORDED
    if Path(f).name == "results.csv" and Path(f).with_name("curves.csv").is_file()
]


def as_flags(values):
    """{"batch_size": 16} -> ["--batch-size", "16"], as the engine's tool commands take them."""
    return [
        arg
        for key, value in values.items()
        for arg in (f"--{key.replace('_', '-')}", str(value))
    ]


def synthetic_data_args(out):
    return ["make-data", "--out", out, *as_flags(SYNTHETIC[out])]


def warm_start_inputs(wildcards):
    spec = WARM_STARTS[f"{PREPARED}/warm/{wildcards.name}"]
    data = spec["data"].split("@")[0]
    return {"model": spec["model"], **({"data": data} if data in SYNTHETIC else {})}


def warm_start_args(out):
    return ["warm-start", "--out", out, *as_flags(WARM_STARTS[out])]


def known_cell(name):
    """The cell ``name`` of a target (runs/{cell}/...): one this matrix does not have is an error
    naming the matrix and its closest cells, before Snakemake looks any further."""
    if name in CELLS:
        return CELLS[name]
    close = get_close_matches(name, CELLS, n=3, cutoff=0.6)
    hint = (
        f"did you mean {' or '.join(close)}?"
        if close
        else f"its {len(CELLS)} cells: {', '.join(sorted(CELLS)[:5])}{', ...' if len(CELLS) > 5 else ''}"
    )
    raise WorkflowError(
        f"matrix config {MATRIX_FILE}: no cell {name!r} (runs/{name}/ is not one of its cells); {hint}"
    )


def cell_inputs(wildcards):
    """The prepared folders a cell reads (none for models and data given by path or hub name), and
    a venv cell's virtualenv record."""
    spec = known_cell(wildcards.cell)
    inputs = {}
    model = config["models"][spec["model"]]
    if "tiny" in model:
        inputs["model"] = model_path(spec["model"])
    if "synthetic" in config["datasets"][spec["dataset"]]:
        inputs["data"] = data_dir(spec["dataset"])
    return {**inputs, **cell_venv_input(wildcards.cell)}


def cell_venv_input(name):
    """The record of the virtualenv a venv cell's jobs run in: the venv rule builds it first."""
    venv = CELLS[name].get("venv")
    return {"venv": venv_record(venv)} if venv else {}


def merge_inputs(wildcards):
    known_cell(wildcards.cell)
    return {"status": f"runs/{wildcards.cell}/status.json", **cell_venv_input(wildcards.cell)}


def prepare_inputs(more=lambda wildcards: {}):
    """A preparation rule's input function: ``more``'s inputs and, when the matrix's environment is
    venv, the record of the virtualenv preparation runs in."""
    venv = {"venv": venv_record(PREPARE_VENV)} if PREPARE_VENV else {}
    return lambda wildcards: {**more(wildcards), **venv}


def attempt(wildcards):
    """Which failed attempt this run retries ("" for none).

    A failed cell is recorded, not raised, so the report can show it; this param makes the next
    invocation run it again: after a failure it names the failed attempt, which differs from the
    value that attempt ran with, so Snakemake sees changed params. A run that succeeds records the
    value it ran with, so the cell then stays done.
    """
    status = cell_jobs.read_status(f"runs/{wildcards.cell}/status.json", ("status", "started", "attempt"))
    if status is None:
        return ""
    return status["attempt"] if status["status"] == "ok" else status["started"]


def saves_checkpoints(name):
    return CELLS[name]["config"].get("trainer", {}).get("save_freq", -1) > 0


def leaves(tree):
    """Every value of a nested config."""
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in leaves(value)]
    return [tree]


def in_container(image, args, values):
    """Where a job's engine commands run: None natively, else the image Snakemake hands the job
    (``container_img`` in a run: block), the profile's apptainer-args (``singularity_args``), and
    binds for what ``values`` (the job's config or arguments) name outside the working directory.
    """
    if image is None:
        return None
    return engine.Container(
        image=image,
        args=args,
        binds=engine.binds(values, Path.cwd()),
        revision=ENGINE["git"],
    )


def cell_container(name, image, args):
    """Where a cell's jobs run the engine (see ``in_container``): binds for what its config names."""
    return in_container(image, args, leaves(CELLS[name]["config"]))


def cell_runner(name, input, image, args):
    """Where a cell's job runs the engine, and why it cannot ("" when it can): a venv cell in the
    virtualenv its ``input.venv`` record names (a failed install is the cell's failure, recorded
    like any other), any other cell as ``cell_container`` says."""
    if CELLS[name].get("venv"):
        venv, problem = deps.virtualenv(input.venv)
        return venv, problem and f"{name} runs in {CELLS[name]['environment']}, but {problem}"
    return cell_container(name, image, args), ""


def prepare_runner(input, image, args, values):
    """Where a preparation job runs the engine: the matrix's image (see ``in_container``), the
    matrix's combination's virtualenv (``input.venv``: its record), or natively (None)."""
    if PREPARE_VENV is None:
        return in_container(image, args, values)
    venv, problem = deps.virtualenv(input.venv)
    if problem:
        raise WorkflowError(
            f"preparation runs in venv {PREPARE_VENV['combination']}, but {problem}"
        )
    return venv


def check_apptainer():
    """Before any job starts: the binary, the local image files and Snakemake's container mechanism
    that apptainer cells need; then say how each cell's engine will be run (a dry run shows it too)."""
    cells = [name for name, spec in CELLS.items() if spec["environment"] == "apptainer"]
    if not cells and PREPARE_IMAGE is None:
        return
    needs = f"cell {cells[0]}" if cells else "preparation"
    if len(cells) > 1:
        needs += f" (and {len(cells) - 1} more)"
    if engine.apptainer_binary() is None:
        raise WorkflowError(
            f"matrix config {MATRIX_FILE}: {needs} runs in an Apptainer image, but neither "
            f"{' nor '.join(engine.BINARIES)} is on PATH (install Apptainer, or set environment: native)"
        )
    images = {PREPARE_IMAGE: "preparation"} if PREPARE_IMAGE is not None else {}
    for name in cells:
        images.setdefault(CELLS[name]["image"], f"cell {name}")
    for image, user in images.items():
        # A relative path is read from the working directory, as local data sets are; Snakemake
        # would hand every job the missing file. A reference (docker://) is pulled; an absolute path
        # may exist only where the jobs run.
        if "://" not in image and not Path(image).expanduser().is_absolute() and not Path(image).exists():
            raise WorkflowError(
                f"matrix config {MATRIX_FILE}: {user} runs in the Apptainer image {image}: no such file or "
                f"folder (a relative image path is read from the working directory, {Path.cwd()})"
            )
    settings = workflow.deployment_settings
    if DeploymentMethod.APPTAINER not in settings.deployment_method:
        raise WorkflowError(
            f"matrix config {MATRIX_FILE}: {needs} runs in an Apptainer image through Snakemake's container "
            "mechanism: pass --software-deployment-method apptainer (the profiles in "
            "configs/profiles set it)"
        )
    if not workflow.is_main_process:
        return
    for name in cells:
        spec = CELLS[name]
        run_in = cell_container(name, spec["image"], settings.apptainer_args)
        argv = engine.command(
            ["train", f"config=runs/{name}/cell.yaml"],
            spec["resources"]["threads"],
            run_in,
        )
        logger.info(f"{name} runs in {spec['image']}: {shlex.join(argv)}")


check_apptainer()


def check_venvs():
    """Before any job starts: uv, where a combination's virtualenv is still to be built; then say
    how each venv cell's engine will be run (a dry run shows it too)."""
    cells = [name for name, spec in CELLS.items() if spec.get("venv")]
    venvs = [CELLS[name]["venv"] for name in cells] + ([PREPARE_VENV] if PREPARE_VENV else [])
    unbuilt = [v for v in venvs if not deps.is_installed(deps.cache_root() / v["key"])]
    if unbuilt:
        try:
            deps.uv()
        except RuntimeError as error:
            needs = f"cell {cells[0]}" if cells else "preparation"
            raise WorkflowError(
                f"matrix config {MATRIX_FILE}: {needs} runs in venv {unbuilt[0]['combination']}, whose virtualenv "
                f"is not built yet ({deps.cache_root() / unbuilt[0]['key']}): {error}"
            )
    if not workflow.is_main_process:
        return
    for name in cells:
        spec = CELLS[name]
        where = engine.Virtualenv(deps.cache_root() / spec["venv"]["key"])
        argv = engine.command(
            ["train", f"config=runs/{name}/cell.yaml"], spec["resources"]["threads"], where
        )
        logger.info(
            f"{name} runs in {spec['environment']} ({spec['venv']['file']}): {shlex.join(argv)}"
        )


check_venvs()


def run_engine(args, log, threads, container):
    """Run an engine command for a preparation step; a failure fails the job."""
    code = engine.run(args, log, threads, container)
    if code:
        raise WorkflowError(f"easyr1 {args[0]} exited with status {code}; see {log}")
