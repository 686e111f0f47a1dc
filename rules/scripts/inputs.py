"""The workflows' own input files, checked when a workflow is read: a mistake in them would
otherwise surface only after every cell had trained, or never."""

from __future__ import annotations

from glob import glob
from pathlib import Path
from typing import Iterable, Sequence

from easyr1.config import ConfigError, read_yaml


def check_unique_keys(config_files: Iterable[str | Path]) -> None:
    """Refuse a key given twice in a config file: Snakemake's loader keeps the last one, so a
    second ``grid:`` would silently drop the first block's cells. Raises ConfigError naming the
    file, line and key."""
    for path in config_files:
        read_yaml(path)


def recorded_files(patterns: Sequence[str], repo: Path, kinds: tuple[str, ...], key: str = "recorded") -> list[str]:
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
