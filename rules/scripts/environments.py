"""Which environment a cell (or preparation) runs in, as the matrix layers it (grid block, then model,
then matrix): native, an Apptainer image, or a dependency combination's virtualenv; and how a cell's
hash and results.csv name that environment."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rules.scripts import deps
from rules.scripts.matrix import PREPARED, Matrix, MatrixError, repo_file

# (environment, image, venv): image for apptainer, venv (``venv_combination``) for venv, else None
Environment = tuple[str, str | None, dict[str, str] | None]


def venv_combination(
    matrix: Matrix, layers: Iterable[tuple[str, dict[str, Any]]], error: Callable[[str], MatrixError]
) -> dict[str, str]:
    """The dependency combination of ``environment: venv``: ``{file, combination, key}``, each of
    ``deps:``'s keys from the first of ``layers`` ((key prefix, block)) that sets it; ``key`` is the
    hash of what its virtualenv installs (deps.env_key). ``error(field)`` is the error for a key
    that no layer sets."""
    layers = list(layers)
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
    if file not in matrix.deps_files:
        matrix.deps_files[file] = deps.load(repo_file(matrix, file_key, file))
    combinations = matrix.deps_files[file]["combinations"]
    if name not in combinations:
        raise matrix.error(
            name_key, f"unknown combination {name!r} in {file}; defined: {', '.join(combinations)}"
        )
    spec = deps.spec(matrix.deps_files[file], name)
    if deps.resolves(spec):  # its virtualenv is known only once installed; a cell's hash needs it now
        raise matrix.error(
            name_key, f"combination {name!r} of {file} pins latest releases: a cell needs fixed versions"
        )
    key = deps.env_key(spec)
    matrix.venv_specs[key] = spec
    return {"file": file, "combination": name, "key": key}


def prepare_venv(matrix: Matrix) -> dict[str, str] | None:
    """The combination preparation runs in when the matrix's environment is venv, else None."""
    if matrix.config["environment"] != "venv":
        return None
    return venv_combination(
        matrix,
        (("", matrix.config),),
        lambda field: matrix.error(
            f"deps.{field}",
            "environment venv needs a dependency combination (deps: {file: ..., combination: ...}): "
            "preparation runs in the matrix's",
        ),
    )


def cell_environment(matrix: Matrix, key: str, model: str, block: dict[str, Any]) -> Environment:
    """(environment, image, venv) of a grid block's cells of ``model``: each from the block, else the
    model, else the matrix (``key`` names the block in errors); image for apptainer, venv (see
    ``venv_combination``) for venv, else None."""
    config = matrix.config
    layers = ((f"{key}.", block), (f"models.{model}.", config["models"][model]), ("", config))
    environment = next(layer["environment"] for _, layer in layers if "environment" in layer)
    if environment == "native":
        return environment, None, None
    if environment == "venv":
        venv = venv_combination(
            matrix,
            layers,
            lambda field: matrix.error(
                key, f"{model}: environment venv needs deps.{field} (deps: on the block, model or matrix)"
            ),
        )
        return environment, None, venv
    image = next((layer["image"] for _, layer in layers if "image" in layer), None)
    if image is None:
        raise matrix.error(
            key, f"{model}: environment apptainer needs an image (image: on the block, model or matrix)"
        )
    return environment, image, None


def environment_key(env: Environment) -> str:
    """What a cell's hash knows of its environment ``env`` = (environment, image, venv): a native
    cell's hash is what it always was; a venv cell's knows its combination and what it installs."""
    environment, image, venv = env
    if venv is not None:
        return f"venv {venv['combination']} {venv['key']}"
    return environment if image is None else f"{environment} {image}"


def environment_label(env: Environment) -> str:
    """How results.csv names the environment: native, apptainer (its image has a column), or venv
    with its combination's name."""
    environment, _, venv = env
    return environment if venv is None else f"venv {venv['combination']}"


def venv_record(venv: dict[str, str]) -> str:
    """The venv rule's record of a combination's virtualenv (where it is, what it has)."""
    return f"{PREPARED}/venv/{venv['combination']}-{venv['key']}.json"
