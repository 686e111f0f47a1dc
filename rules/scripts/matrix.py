"""A baselines matrix as the workflow reads it: its config, where it came from, and what resolving it
records (the repository files it names, the dependency combinations its cells run in); its errors,
which name the matrix file and the key; and the small tree helpers that build a cell's config."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snakemake.exceptions import WorkflowError

PREPARED = "runs/prepared"  # tiny models, synthetic data sets, warm starts and virtualenv records


class MatrixError(WorkflowError):
    """A mistake in the matrix config, named by its file and key before any job starts."""


@dataclass(eq=False)  # hashed by identity: functools.cache keys on it
class Matrix:
    """The matrix config (Snakemake's ``config``, validated and with its schema's defaults), where it
    came from, and what resolving it has found so far."""

    config: dict[str, Any]
    repo: Path  # the checkout, resolved: one spelling however -s names it
    file: Path  # the matrix file as errors name it
    command_line: dict[str, Any] = field(default_factory=dict)  # keys given with --config
    # What a cell's hash knows of each repository file resolved (``repo_file``): its path in the
    # repository (or, outside it, its absolute path) and its content's digest.
    files: dict[str, str] = field(default_factory=dict)
    deps_files: dict[str, dict] = field(default_factory=dict)  # dependency matrix file -> as loaded
    venv_specs: dict[str, dict] = field(default_factory=dict)  # combination key -> install spec
    engine_file: str = ""  # the engine config every cell starts from (``read_engine``)
    base: dict[str, Any] = field(default_factory=dict)  # its tree
    prepare_image: str | None = None  # the image preparation runs in (environment apptainer)
    prepare_venv: dict[str, str] | None = None  # the combination preparation runs in (environment venv)
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> spec (``grid.expand_grid``)

    def from_command_line(self, key: str, message: str = "") -> str:
        """The end of an error, ``(KEY came from --config, ...)``, when the config key ``key``
        (``grid[0].models``: its top key), or a key that ``message`` quotes, was given on the command
        line; "" otherwise."""
        top = key.split(".")[0].split("[")[0]
        given = (
            top
            if top in self.command_line
            else next((k for k in self.command_line if f"'{k}'" in message), None)
        )
        return f" ({given} came from --config, not from the file)" if given else ""

    def error(self, key: str, message: str) -> MatrixError:
        return MatrixError(f"matrix config {self.file}: {key}: {message}{self.from_command_line(key)}")


def repo_file(matrix: Matrix, key: str, path: str) -> str:
    """A file of the repository (engine config, format prompt, reward file), as an absolute path:
    the engine reads it from the working directory."""
    full = matrix.repo / path
    if not full.is_file():
        raise matrix.error(key, f"file not found: {full}")
    digest = hashlib.sha256(full.read_bytes()).hexdigest()[:12]
    place = full.relative_to(matrix.repo) if full.is_relative_to(matrix.repo) else full
    matrix.files[str(full)] = f"{place}@{digest}"
    return str(full)


def portable(matrix: Matrix, value: Any) -> Any:
    """``value`` as a hash should see it: a file ``repo_file`` resolved (a reward function's
    ``path:function`` too) becomes its place in the repository and its content's digest. So the
    same checkout reached through another path (a symlink, a relative ``-s``, a moved clone) keeps
    its cells, whose runs a changed hash would replace, and an edited reward file reruns them."""
    if isinstance(value, dict):
        return {key: portable(matrix, item) for key, item in value.items()}
    if isinstance(value, list):
        return [portable(matrix, item) for item in value]
    if isinstance(value, str):
        path, colon, function = value.rpartition(":") if ":" in value else (value, "", "")
        if path in matrix.files:
            return f"{matrix.files[path]}{colon}{function}"
        if value in matrix.files:
            return matrix.files[value]
    return value


def short_hash(matrix: Matrix, value: Any) -> str:
    return hashlib.sha256(json.dumps(portable(matrix, value), sort_keys=True).encode()).hexdigest()[:12]


def nested(dotted: dict[str, Any]) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}}."""
    tree: dict[str, Any] = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def leaves(tree: Any) -> list[Any]:
    """Every value of a nested config."""
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in leaves(value)]
    return [tree]


def as_flags(values: dict[str, Any]) -> list[str]:
    """{"batch_size": 16} -> ["--batch-size", "16"], as the engine's tool commands take them."""
    return [arg for key, value in values.items() for arg in (f"--{key.replace('_', '-')}", str(value))]
