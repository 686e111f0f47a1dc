"""The records the pages read, checked when they are read: one table per kind of record names the
keys or columns the page code reads and what each must hold.

A damaged or hand-edited record (a cut file, a string where a number belongs, a missing column)
would otherwise crash the table or plot code with a traceback that names no file, or render
silently wrong (every cell FAILED, a row dated nan). Only the standard library is used: the
workflow checks the committed records with this when it is read, before any job runs.

A spec is ``str``, ``int``, ``bool``, ``float`` (any finite number) or ``None`` (null, or an empty
CSV value); a tuple of specs: any of them; ``[spec]``: a list of such; ``{"*": spec}``: a mapping
of such; ``{"key": spec, "key?": spec}``: an object with those keys, the ones marked ``?`` optional.
A CSV table is an object spec over its columns: ``?`` marks a column older records lack.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

Spec = Any  # see the module's docstring
OPTIONAL = "?"
TEXT_OR_NONE = (str, None)
NUMBER_OR_NONE = (float, None)

# A GPU benchmark record (``easyr1 bench``, baselines/gpu/*.json), as reports/baselines/rows.py reads it.
BENCH_RECORD: dict[str, Spec] = {
    "workload": str,
    "backend": str,
    "model": str,
    "steps": int,
    "step_s": float,
    "tokens_per_s": float,
    "date?": str,
    "gpus?": (int, None),
    "simulated_ranks?": (int, None),  # rank 0 of the ``gpus``-rank job alone, against a fake process group
    "gpu?": TEXT_OR_NONE,
    "precision?": TEXT_OR_NONE,
    "dtype?": TEXT_OR_NONE,
    "engine?": TEXT_OR_NONE,
    "overrides?": ([str], None),
    "tensor_parallel_size?": (int, None),
    "vllm_awake?": (bool, None),
    "vllm_env?": ({"*": str}, None),
    "allocator_env?": ({"*": str}, None),
    "per_step?": [{"step": int, "perf/time_per_step?": float}],
    "phases?": ({"*": NUMBER_OR_NONE}, None),  # a phase only the warm-up step ran has no median
    "trl?": ({"mode?": TEXT_OR_NONE, "step_times?": ([float], None), "steps?": ([float], int, None)}, None),
    "peak_mem_gib?": NUMBER_OR_NONE,
    "peak_held_gib?": NUMBER_OR_NONE,
    "peak_mem_allocated_gib?": NUMBER_OR_NONE,
    "mfu_actor?": NUMBER_OR_NONE,
    "profile?": (
        {
            "step": int,
            "time": str,
            "phases": {"*": {"wall_s": NUMBER_OR_NONE, "ops_s": float, "top": [{"op": str, "share": float}]}},
        },
        None,
    ),
    "host_profile?": (
        {"step": int, "phases": {"*": {"s": float, "self": [{"function": str, "share": float}]}}},
        None,
    ),
}

# A capped-memory record (baselines/gpu/memory/*/*.json), as reports/hardware_records.py reads it.
MEMORY_RECORD: dict[str, Spec] = {
    "workload": str,
    "backend": str,
    "precision": str,
    "gpus": int,
    "simulated_ranks?": (int, None),  # rank 0 of the ``gpus``-rank job alone, against a fake process group
    "gpu": TEXT_OR_NONE,  # none where the smoke workload ran on a CPU rank (the tests)
    "date?": str,
    "gpu_memory_gib?": NUMBER_OR_NONE,
    "gpu_total_gib?": NUMBER_OR_NONE,
    "gpu_other_memory_gib?": NUMBER_OR_NONE,
    "step_s?": NUMBER_OR_NONE,
    "overrides?": ([str], None),
    "memory_phases?": ({"*": {"allocated?": float, "device?": float}}, None),
    "oom?": ({"phase": str, "max_allocated_gib?": float}, None),
    # What the estimate of a record is made with, where the record says (older ones do not).
    "recomputed_blocks?": NUMBER_OR_NONE,
    "vllm_awake?": (bool, None),
    "vllm_gpu_memory_utilization?": NUMBER_OR_NONE,
    "tensor_parallel_size?": (int, None),
    "vllm_env?": ({"*": str}, None),
    "allocator_env?": ({"*": str}, None),
}

# A cell's row (rules/scripts/collect.py's COLUMNS: runs/results.csv, baselines/cpu/*/results.csv).
# A failed cell leaves most values empty; its name and status it always has. Text columns the page
# reads only where present (engine, git, environment, image, launcher, error_tail) take any value.
CELL_RECORD: dict[str, Spec] = {
    "cell": str,
    "status": str,
    "date": TEXT_OR_NONE,
    "model": TEXT_OR_NONE,
    "size": TEXT_OR_NONE,
    "dataset": TEXT_OR_NONE,
    "algorithm": TEXT_OR_NONE,
    "bits": TEXT_OR_NONE,
    "hardware": TEXT_OR_NONE,
    "host": TEXT_OR_NONE,
    "versions": TEXT_OR_NONE,
    "config_hash": TEXT_OR_NONE,
    "rollout": TEXT_OR_NONE,
    "merged": TEXT_OR_NONE,
    "lora": (int, None),
    "steps": (int, None),
    "steps_done": (int, None),
    "devices": (int, None),
    "rollout_tp": (int, None),
    "nodes?": (int, None),  # records from before a cell could span nodes lack it, and the launcher
    "val_before": NUMBER_OR_NONE,
    "val_after": NUMBER_OR_NONE,
    "lr": NUMBER_OR_NONE,
    "kl_coef": NUMBER_OR_NONE,
    "throughput": NUMBER_OR_NONE,
    "time_per_step": NUMBER_OR_NONE,
    "calibrated_cpu_step?": NUMBER_OR_NONE,  # records from before 2026-12-07 lack it
    "mfu_actor": NUMBER_OR_NONE,
    "peak_cpu_memory_gb": NUMBER_OR_NONE,
    "peak_gpu_memory_gb": NUMBER_OR_NONE,
    "peak_gpu_reserved_gb": NUMBER_OR_NONE,
    "peak_gpu_memory_smi_gb": NUMBER_OR_NONE,
}

# A cell's curve, a row a step (collect.py's CURVE_COLUMNS: runs/curves.csv and beside each results.csv).
CURVE_RECORD: dict[str, Spec] = {
    "cell": str,
    "date": str,
    "step": int,
    "reward_metric": str,
    "val_metric": str,
    "reward": NUMBER_OR_NONE,
    "val": NUMBER_OR_NONE,
}


class RecordError(ValueError):
    """A record that cannot be read as one; the message names its file and what is wrong where."""


def unreadable(path: str | Path, detail: str) -> RecordError:
    return RecordError(f"{path}: not a record the page can read ({detail})")


def read_json(path: str | Path, spec: dict[str, Spec]) -> dict[str, Any]:
    """A JSON record checked against ``spec``; RecordError naming the file and the key otherwise."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:  # a cut file, bytes that are not UTF-8
        raise unreadable(path, f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(record, dict):
        raise unreadable(path, f"a JSON {type(record).__name__}, not an object")
    return check_record(record, spec, path)


def check_record(record: dict[str, Any], spec: dict[str, Spec], path: str | Path) -> dict[str, Any]:
    """``record`` (read from ``path``) checked against ``spec``: RecordError naming the key otherwise."""
    problem = _problem(record, spec, "")
    if problem:
        raise unreadable(path, f"key {problem}")
    return record


def check_csv(path: str | Path, columns: dict[str, Spec]) -> None:
    """A CSV record checked against ``columns``: each is there (unless optional), every row has
    every field (a row cut short would read as a row of empty values), every value is of its kind.
    RecordError naming the file, the line, the row's cell and the column otherwise."""
    try:
        with open(path, newline="") as f:
            rows = csv.reader(f, strict=True)
            header = next(rows, None)
            if not header:
                raise unreadable(path, "no header line")
            missing = _missing_key(dict.fromkeys(header), columns)
            if missing:
                raise unreadable(path, f"column {missing!r} missing")
            for row in rows:
                problem = _row_problem(header, row, columns)
                if problem:
                    cell = dict(zip(header, row, strict=False)).get(
                        "cell"
                    )  # a row cut short or too long: its problem is said below
                    raise unreadable(
                        path, f"line {rows.line_num}{f', cell {cell}' if cell else ''}: {problem}"
                    )
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise unreadable(path, f"{type(exc).__name__}: {exc}") from exc


def _row_problem(header: list[str], row: list[str], columns: dict[str, Spec]) -> str | None:
    if len(row) < len(header):
        return (
            f"the row is cut short ({len(row)} of {len(header)} fields): "
            f"column {header[len(row)]!r} and those after it missing"
        )
    if len(row) > len(header):
        return f"{len(row) - len(header)} fields more than the header has"
    kinds = {key.removesuffix(OPTIONAL): spec for key, spec in columns.items()}
    values = {
        name: _parsed(text, kinds[name]) for name, text in zip(header, row, strict=True) if name in kinds
    }
    problem = _problem(values, columns, "")
    return f"column {problem}" if problem else None


def _parsed(text: str, spec: Spec) -> Any:
    """A CSV field as its column's kind reads it: empty is None; in a column of text, text (a
    fingerprint may be all digits); else a number where it is one, a whole one as an int."""
    if text == "" or str in (spec if isinstance(spec, tuple) else (spec,)):
        return text or None
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() else number


def _problem(value: Any, spec: Spec, where: str) -> str | None:
    """What is wrong with ``value`` as ``spec``, starting with where (a key path), or None."""
    if isinstance(spec, tuple):
        if any(_problem(value, kind, where) is None for kind in spec):
            return None
        # The alternative of the value's own shape (a list, an object) says best what is wrong inside it.
        inner = next(
            (kind for kind in spec if _container(kind) and isinstance(value, _container(kind))), None
        )
        return _problem(value, inner, where) if inner is not None else _mismatch(value, spec, where)
    if isinstance(spec, list):
        if not isinstance(value, list):
            return _mismatch(value, spec, where)
        return next(
            (p for i, item in enumerate(value) if (p := _problem(item, spec[0], f"{where}[{i}]"))), None
        )
    if isinstance(spec, dict):
        return _object_problem(value, spec, where)
    return None if _scalar(value, spec) else _mismatch(value, spec, where)


def _object_problem(value: Any, spec: dict[str, Spec], where: str) -> str | None:
    if not isinstance(value, dict):
        return _mismatch(value, spec, where)
    missing = _missing_key(value, spec)
    if missing:
        return f"{_path(where, missing)!r} missing"
    kinds = (
        [(key, spec["*"]) for key in value]
        if "*" in spec
        else [(k.removesuffix(OPTIONAL), s) for k, s in spec.items()]
    )
    return next(
        (p for key, kind in kinds if key in value and (p := _problem(value[key], kind, _path(where, key)))),
        None,
    )


def _missing_key(value: dict[str, Any], spec: dict[str, Spec]) -> str | None:
    return next((key for key in spec if key != "*" and not key.endswith(OPTIONAL) and key not in value), None)


def _container(spec: Spec) -> type | None:
    return list if isinstance(spec, list) else dict if isinstance(spec, dict) else None


def _scalar(value: Any, kind: Any) -> bool:
    if kind is None:
        return value is None
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _mismatch(value: Any, spec: Spec, where: str) -> str:
    if value is None:
        return f"{where!r} is empty, not {_kind(spec)}"
    return f"{where!r}: {json.dumps(value)[:60]} is not {_kind(spec)}"


def _kind(spec: Spec) -> str:
    if isinstance(spec, tuple):
        return " or ".join(_kind(kind) for kind in spec)
    if isinstance(spec, list):
        return f"a list of {_kind(spec[0])}"
    if isinstance(spec, dict):
        return "an object"
    return {
        None: "empty",
        str: "text",
        int: "a whole number",
        float: "a finite number",
        bool: "true or false",
    }[spec]


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def check_recorded(paths: list[str]) -> None:
    """The committed records a matrix lists (``recorded:``), each by its kind: a benchmark record,
    or a CPU or GPU cell record with its curves beside it."""
    for path in paths:
        if path.endswith(".json"):
            read_json(path, BENCH_RECORD)
            continue
        check_csv(path, CELL_RECORD)
        curves = Path(path).with_name("curves.csv")
        if curves.is_file():
            check_csv(curves, CURVE_RECORD)


def check_memory_records(paths: list[str]) -> None:
    """The capped-memory records the hardware page reads (baselines/gpu/memory/)."""
    for path in paths:
        read_json(path, MEMORY_RECORD)
