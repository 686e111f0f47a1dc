"""The workflows' own input files, checked when a workflow is read: a mistake in them would
otherwise surface only after every cell had trained, or never."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import cache
from glob import glob
from pathlib import Path

from easyr1.config import ConfigError, read_yaml


def _key_path(parts: Iterable[str | int]) -> str:
    """["grid", 0, "models"] -> "grid[0].models", as the harness's errors name a config's keys."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def check_schema(data: dict, schema: str | Path) -> None:
    """Check ``data`` (a config as loaded) against the JSON schema file ``schema``, filling in its
    defaults, as Snakemake's ``validate`` does; a ConfigError naming the key that does not fit and
    why (``grid[0]: Additional properties are not allowed ('model' was unexpected)``), where
    Snakemake's names no file and prints the schema."""
    from jsonschema import ValidationError
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    try:
        validate(data, str(schema))
    except WorkflowError as exc:
        error = exc.__context__
        if not isinstance(error, ValidationError):
            raise
        message = error.message
        if message.endswith("not valid under any of the given schemas"):  # which ones?
            message += f" ({error.validator}: {', '.join(map(str, error.validator_value))})"
        raise ConfigError(f"{_key_path(error.absolute_path) or '(top level)'}: {message}") from None


def check_unique_keys(config_files: Iterable[str | Path]) -> None:
    """Refuse a key given twice in a config file: Snakemake's loader keeps the last one, so a
    second ``grid:`` would silently drop the first block's cells. Raises ConfigError naming the
    file, line and key."""
    for path in config_files:
        read_yaml(path)


def foreign_config_here(config_files: Iterable[str | Path], repo: Path, own: str, outputs: str) -> str:
    """Why this run may not go on ("" when it may): the working directory is the repository ``repo``
    and a config file is not one of its own (``own``: their folder in it). The repository's committed
    ``outputs`` (its results and pages) are made from its own configs only; another one, run there,
    would replace them and drop the committed records its config does not list."""
    if Path.cwd().resolve() != repo.resolve():
        return ""
    for path in config_files:
        if Path(path).resolve().parent != (repo / own).resolve():
            return (
                f"{path} is not one of the repository's own configs ({own}/*.yaml), and the working "
                f"directory is the repository ({repo}), whose {outputs} are made from its own configs only: "
                f"pass -d DIR (--directory DIR) to run it in DIR, where its runs, results and page go"
            )
    return ""


def recorded_files(
    patterns: Sequence[str], repo: Path, kinds: tuple[str, ...], key: str = "recorded"
) -> list[str]:
    """The committed records that ``patterns`` (globs relative to ``repo``, the config's ``key``)
    name, each a file whose name ends in one of ``kinds``. A pattern that matches nothing, or a
    folder or another file, is an error naming ``key[i]``: the page would silently lack those
    records, or the report fail after every cell had trained."""
    files: set[str] = set()
    for index, pattern in enumerate(patterns):
        matches = sorted(glob(str(repo / pattern)))
        if not matches:
            raise ConfigError(f"{key}[{index}]: {pattern!r} matches no file under {repo}")
        for match in matches:
            if not (Path(match).is_file() and match.endswith(kinds)):
                raise ConfigError(
                    f"{key}[{index}]: {pattern!r} matches {match}, which is not a record "
                    f"(a file named *{' or *'.join(kinds)})"
                )
        files.update(matches)
    return sorted(files)


@cache
def data_columns(path: Path) -> tuple[str, ...] | None:
    """The columns of a local data file, read cheaply: a parquet file's schema, a JSON lines file's
    first row. None where that cannot tell (another format, an empty file, a JSON array or an
    object over several lines: the engine reads those whole)."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return tuple(pq.read_schema(path).names)
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"cannot be read as parquet ({exc})") from None
    if path.suffix not in (".json", ".jsonl"):
        return None
    with path.open("rb") as f:
        first = f.readline().strip()
    try:
        row = json.loads(first)
    except ValueError:
        return None
    return tuple(row) if isinstance(row, dict) else None


def check_columns(path: Path, needed: dict[str, str]) -> None:
    """A ConfigError naming the first column of ``needed`` (config key -> column, as
    ``{"data.prompt_key": "problem"}``) that the data file ``path`` lacks, with the columns it has:
    found here, it stops the matrix before any job instead of every cell's run after preparation."""
    columns = data_columns(path)
    if columns is None:
        return
    for key, column in needed.items():
        if column not in columns:
            raise ConfigError(f"no column {column!r} ({key}); its columns: {', '.join(columns)}")
