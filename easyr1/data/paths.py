"""What a data set's or model's name says before anything is read: its split, and whether it can
only be a local file or folder, never a hub id. Light (no ``datasets``, no torch), so the harness
checks a matrix with it."""

from __future__ import annotations

import os

FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}


def split_path(data_path: str) -> tuple[str, str | None]:
    """``"path@split"`` -> ``("path", "split")``; a path that exists as written keeps its ``@``."""
    if "@" in data_path and not os.path.exists(data_path):
        path, split = data_path.rsplit("@", 1)
        return path, split
    return data_path, None


def names_a_local_path(path: str) -> bool:
    """A name that can only be on the file system, so it must exist here: a data file's name, a path
    from /, ~ or . (hub ids start with a letter or digit), or one of three parts or more (hub ids
    of models and data sets are ``name`` or ``org/name``)."""
    return (
        os.path.splitext(path)[1] in FORMATS
        or path.startswith(("/", "~", "."))
        or path.rstrip("/").count("/") > 1
    )
