"""Property-based tests (hypothesis) of what the engine reads from a user: config files, dotted
overrides and data files. Whatever they hold, reading them either succeeds or raises the error the
CLI turns into one line (``ConfigError``, ``DatasetError``); never another exception, a hang, or
memory that grows with what aliases expand to. Example counts are kept small: the whole module
runs in well under a minute."""

from __future__ import annotations

import dataclasses
import json
import signal
import string
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from easyr1.config import ConfigError, PPOConfig, load_config
from easyr1.data.config import DataConfig
from easyr1.data.dataset import DatasetError, RLDataset
from easyr1.models.loading import load_tokenizer

_LIMIT_S = 60  # per example (a few ms each, unloaded): a hang ends the test instead of holding the suite
_MEMORY_BYTES = 200 * 2**20  # per example, traced: an expanded alias bomb would take gigabytes

FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True, scope="module")
def _imported() -> None:
    """What reading a config imports on first use (the reward loader's libraries), imported before
    any example is traced and timed."""
    load_config(["worker.reward.reward_function=math"])


@contextmanager
def _bounded() -> Iterator[None]:
    """Fail if the block takes longer than ``_LIMIT_S`` or allocates more than ``_MEMORY_BYTES``."""

    def late(signum: int, frame: Any) -> None:
        raise AssertionError(f"still reading after {_LIMIT_S} s: a hang")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(_LIMIT_S)
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
        assert peak < _MEMORY_BYTES, f"{peak / 2**20:.0f} MiB to read a small input"
    finally:
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _dotted_keys(cls: type = PPOConfig, prefix: str = "") -> list[str]:
    out: list[str] = []
    for f in dataclasses.fields(cls):
        value = getattr(cls(), f.name)
        if dataclasses.is_dataclass(value):
            out += _dotted_keys(type(value), f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name}")
    return out


KEYS = _dotted_keys()
# A key of the schema, a part of one, or any text: the loader must name what it cannot use.
key_text = st.one_of(
    st.sampled_from(KEYS),
    st.sampled_from(sorted({part for key in KEYS for part in key.split(".")})),
    st.text(string.ascii_letters + "._-", max_size=20),
    st.text(max_size=10),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
yaml_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[leaf] = value
    return tree


def _alias_text(width: int, levels: int) -> str:
    """A flow collection of ``levels`` anchors, each holding ``width`` aliases of the one before."""
    parts = ["&a0 [" + ", ".join(["x"] * width) + "]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def _loads_or_config_error(args: list[str]) -> None:
    with _bounded():
        try:
            load_config(args)
        except ConfigError:
            pass


@FEW
@given(text=st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_any_config_file_loads_or_is_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, text: str | bytes
) -> None:
    path = tmp_path_factory.mktemp("yaml") / "config.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    _loads_or_config_error([f"config={path}"])


@FEW
@given(flat=st.dictionaries(key_text, yaml_values, max_size=6), anchors=st.booleans())
def test_any_config_tree_loads_or_is_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, flat: dict[str, Any], anchors: bool
) -> None:
    tree = _nest(flat)
    if anchors:  # the same object twice: YAML writes it once, with an anchor and an alias
        shared = {"k": [1, 2, 3]}
        tree = {"worker": {"reward": {"reward_function_kwargs": {"a": shared, "b": shared}}}, **tree}
    path = tmp_path_factory.mktemp("yaml") / "config.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=True))
    _loads_or_config_error([f"config={path}"])


@FEW
@given(
    overrides=st.lists(
        st.tuples(key_text, st.one_of(st.text(max_size=40), yaml_values.map(json.dumps))), max_size=5
    )
)
def test_any_dotted_overrides_load_or_are_a_config_error(overrides: list[tuple[str, str]]) -> None:
    _loads_or_config_error([f"{key}={value}" for key, value in overrides])


@settings(max_examples=25, deadline=None)
@given(width=st.integers(1, 12), levels=st.integers(1, 9), on_command_line=st.booleans())
def test_aliases_load_within_bounds_or_are_refused(
    tmp_path_factory: pytest.TempPathFactory, width: int, levels: int, on_command_line: bool
) -> None:
    """Any nesting of aliases: what expands to a few thousand values loads, what expands to more
    than the loader's bound is refused, quickly and in little memory, whatever the total would be."""
    text = _alias_text(width, levels)
    if on_command_line:
        args = [f"worker.reward.reward_function_kwargs.k={text}"]
    else:
        path = tmp_path_factory.mktemp("yaml") / "config.yaml"
        path.write_text(f"worker:\n  reward:\n    reward_function_kwargs:\n      k: {text}\n")
        args = [f"config={path}"]
    expanded = sum(width**level for level in range(1, levels + 1))
    with _bounded():
        if expanded < 10_000:
            load_config(args).to_yaml()
        elif expanded > 200_000:
            with pytest.raises(ConfigError, match="aliases expand to more than"):
                load_config(args)
        else:
            _loads_or_config_error(args)


@settings(max_examples=15, deadline=None)
@given(levels=st.integers(1, 1500), on_command_line=st.booleans())
def test_any_nesting_loads_or_is_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, levels: int, on_command_line: bool
) -> None:
    """Lists in lists: what loads can also be printed (the config's copies and printer recurse)."""
    text = "[" * levels + "]" * levels
    if on_command_line:
        args = [f"worker.reward.reward_function_kwargs.k={text}"]
    else:
        path = tmp_path_factory.mktemp("yaml") / "config.yaml"
        path.write_text(f"worker:\n  reward:\n    reward_function_kwargs:\n      k: {text}\n")
        args = [f"config={path}"]
    with _bounded():
        try:
            load_config(args).to_yaml()
        except ConfigError:
            pass


# ----------------------------------------------------------------------------- data files


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Callable[[str], Path]) -> Any:
    return load_tokenizer(str(tiny_model("qwen2")))


DATA = DataConfig(max_prompt_length=64, filter_overlong_prompts_workers=1)
column = st.sampled_from(["prompt", "answer", "images", "videos", "other"])
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**20), 10**20),
        st.floats(allow_nan=False),
        st.text(max_size=30),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
rows = st.lists(st.dictionaries(column, json_values, max_size=5), min_size=0, max_size=6)


def _reads_or_dataset_error(path: Path, tokenizer: Any) -> None:
    with _bounded():
        try:
            dataset = RLDataset(str(path), tokenizer, None, DATA)
            for i in range(len(dataset)):
                dataset[i]
        except DatasetError:
            pass


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(
        st.one_of(rows.map(lambda r: json.dumps(r[0]) if r else "{}"), st.text(max_size=40)), max_size=6
    )
)
def test_any_json_lines_read_or_are_a_dataset_error(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, lines: list[str]
) -> None:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    _reads_or_dataset_error(path, tokenizer)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=rows)
def test_any_parquet_rows_read_or_are_a_dataset_error(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, records: list[dict[str, Any]]
) -> None:
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    try:
        pq.write_table(pa.Table.from_pylist(records), path)
    except (pa.ArrowException, OverflowError):
        assume(False)  # rows that arrow or parquet cannot hold: no such parquet file can exist
    _reads_or_dataset_error(path, tokenizer)
