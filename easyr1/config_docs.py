"""What each config key means: its doc (the string written after the field in its config class),
its type, its default, and EasyR1's default where it differs (``easyr1 config --explain KEY``).

The docs are read from the config classes' source at run time, so a field's doc lives in one place,
beside the field.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

from easyr1.config import ConfigError, PPOConfig, override_value, unknown_key

# Keys whose default in EasyR1's schema (verl/*/config.py) differs from this engine's, with EasyR1's.
EASYR1_DEFAULTS: dict[str, Any] = {
    "worker.actor.model.enable_gradient_checkpointing": True,
    "worker.critic.model.enable_gradient_checkpointing": True,
    "worker.rollout.name": "vllm",
}

# Keys this engine adds to EasyR1's schema (some of them veRL's).
NOT_IN_EASYR1: frozenset[str] = frozenset(
    {
        "data.video_max_frames",
        "algorithm.norm_adv_by_std_in_grpo",
        "worker.actor.entropy_coeff",
        "worker.reward.timeout",
        "worker.rollout.limit_videos",
        "worker.rollout.max_num_seqs",
        "worker.rollout.calculate_log_probs",
        "worker.rollout.free_cache_engine",
        "trainer.profile_steps",
        "trainer.host_profile_steps",
        "trainer.stall_report_s",
    }
)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """A config class's field docs by field name: the string literal that follows each field."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def config_classes(cls: type = PPOConfig) -> Iterator[type]:
    """``cls`` and every config class nested in it, each once."""
    seen: set[type] = set()

    def walk(c: type) -> Iterator[type]:
        if c in seen:
            return
        seen.add(c)
        yield c
        for tp in typing.get_type_hints(c).values():
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                yield from walk(tp)

    yield from walk(cls)


def type_text(tp: Any) -> str:
    """A field's type as a user writes its values."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(override_value(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        options: list[str] = []
        for arg in args:
            if typing.get_origin(arg) is Literal:
                options += [override_value(a) for a in typing.get_args(arg)]
            else:
                options.append({bool: "true, false", type(None): "null"}.get(arg) or type_text(arg))
        return ", ".join(options[:-1]) + " or " + options[-1]
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)}: " + ", ".join(type_text(a) for a in args)
        return f"a list of {type_text(args[0])}" if args else "a list"
    if origin is dict:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


def explain(key: str) -> str:
    """The documentation of ``key`` (``a.b.c``, a field or a section), as ``easyr1 config --explain``
    prints it; an unknown key is a ConfigError naming it."""
    cls: type = PPOConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        prefix = "".join(f"{p}." for p in parts[:i])
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            raise unknown_key(part, cls, prefix)
        tp = typing.get_type_hints(cls)[part]
        doc = field_docs(cls).get(part, "")
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if i == len(parts) - 1:  # a section: its doc and its keys
                docs = field_docs(tp)
                lines = [f"{key}: {doc}", "", "keys:"]
                return "\n".join(
                    lines
                    + [
                        f"  {key}.{name}: {docs.get(name, '')}"
                        for name in (f.name for f in dataclasses.fields(tp))
                    ]
                )
            cls = tp
            continue
        if i != len(parts) - 1:
            raise ConfigError(f"{'.'.join(parts[: i + 1])} is a key, not a section: {key!r} does not exist")
        default = _default(fields[part])
        lines = [f"{key}: {doc}", f"  type: {type_text(tp)}", f"  default: {override_value(default)}"]
        if key in NOT_IN_EASYR1:
            lines.append("  EasyR1: not a key of its schema (added here)")
        elif key in EASYR1_DEFAULTS:
            lines.append(f"  EasyR1's default: {override_value(EASYR1_DEFAULTS[key])}")
        return "\n".join(lines)
    raise ConfigError("--explain needs a key, such as worker.actor.optim.lr")
