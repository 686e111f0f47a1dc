"""Load a reward function from a built-in name or an EasyR1-style `path/file.py[:function]`.

EasyR1 reward files must work unchanged: the function (default `main`) takes a batch of input
dicts (`REWARD_TYPE = "batch"`, also the default when unset) or one dict at a time
(`REWARD_TYPE = "sequential"`); inputs have `response`, `response_length`, `ground_truth`;
each result is a dict with `overall` plus any other scores, all logged. `RewardFunction`
hides that difference and checks results, so a broken reward file fails with its name on it
instead of somewhere deep in the trainer.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from easyr1.config import ConfigError
from easyr1.rewards.config import RewardConfig

BUILTINS = {"math": "easyr1.rewards.math", "r1v": "easyr1.rewards.r1v", "dapo": "easyr1.rewards.dapo"}
BUILTIN_FUNCTION = "compute_score"
REWARD_TYPES = ("batch", "sequential")


class RewardFunctionError(RuntimeError):
    """A reward function that cannot be loaded, fails, or returns malformed scores."""


_PREVIEW_CHARS = 40


def preview(item: dict[str, Any]) -> str:
    """An input as errors name it: enough of its response and ground truth to find and replay it."""
    return f"response {_shorten(item.get('response'))}, ground_truth {_shorten(item.get('ground_truth'))}"


def _shorten(value: Any) -> str:
    """Head and tail of a long text: a response's answer is usually at its end."""
    text = str(value)
    if len(text) > 2 * _PREVIEW_CHARS + 5:
        return f"{text[:_PREVIEW_CHARS]!r} ... {text[-_PREVIEW_CHARS:]!r}"
    return repr(text)


class RewardFunction:
    """A loaded reward function: always called with a batch, always returns float score dicts."""

    def __init__(
        self, fn: Callable[..., Any], reward_type: str, name: str, source: str, kwargs: dict[str, Any]
    ) -> None:
        self.fn = fn
        self.reward_type = reward_type
        self.name = name  # as the user wrote it, for logs and errors
        self.source = source  # a spec that reloads it from any working directory
        self.kwargs = kwargs

    def __call__(
        self, inputs: list[dict[str, Any]], started: Callable[[int | None], None] = lambda index: None
    ) -> list[dict[str, float]]:
        """``started(index)`` is told before each call of the user's function (index None: the whole
        batch in one call), so that the reward worker can time each call and name its input."""
        inputs = list(inputs)
        if not inputs:
            return []
        if self.reward_type == "batch":
            started(None)
            results = self._call(inputs, "the batch")
            if isinstance(results, (Mapping, str, bytes)) or not isinstance(results, Iterable):
                raise RewardFunctionError(
                    f"reward function {self.name} returned {type(results).__name__}; "
                    f"a batch reward function must return a list of {len(inputs)} dicts"
                )
            results = list(results)  # EasyR1 accepted any iterable (a generator, a tuple)
        else:
            results = []
            for index, item in enumerate(inputs):
                started(index)
                results.append(self._call(item, f"input {index} ({preview(item)})"))
        if len(results) != len(inputs):
            raise RewardFunctionError(
                f"reward function {self.name} returned {len(results)} scores for {len(inputs)} inputs"
            )
        return [self._checked(index, score, inputs[index]) for index, score in enumerate(results)]

    def __reduce__(self) -> tuple[Any, ...]:
        # Modules loaded from a path cannot be pickled by reference; reload in the receiving process.
        return load_reward_function, (self.source, self.kwargs)

    def __repr__(self) -> str:
        return f"RewardFunction({self.name!r}, reward_type={self.reward_type!r}, kwargs={self.kwargs!r})"

    def _call(self, argument: Any, what: str) -> Any:
        try:
            return self.fn(argument, **self.kwargs)
        except Exception as exc:
            raise RewardFunctionError(
                f"reward function {self.name} raised {type(exc).__name__} on {what}: {exc}"
            ) from exc

    def _checked(self, index: int, score: Any, item: dict[str, Any]) -> dict[str, float]:
        where = f"reward function {self.name}: score {index} ({preview(item)})"
        if not isinstance(score, Mapping):
            raise RewardFunctionError(f"{where} is a {type(score).__name__}, expected a dict with 'overall'")
        if "overall" not in score:
            raise RewardFunctionError(f"{where} has no 'overall' key (keys: {sorted(map(str, score))})")
        floats = {}
        for key, value in score.items():
            if isinstance(value, (str, bytes)):  # float("1") would pass: text is no score
                raise RewardFunctionError(f"{where}: {key!r} = {value!r} is text, not a float")
            try:
                floats[str(key)] = float(value)
            except (TypeError, ValueError) as exc:
                raise RewardFunctionError(f"{where}: {key!r} = {value!r} is not a float ({exc})") from None
        for key, value in floats.items():  # every key becomes a logged mean, which NaN would poison
            if not math.isfinite(value):
                raise RewardFunctionError(f"{where}: {key!r} = {value} is not finite")
        return floats


def is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or ".py:" in spec


def _parse(spec: str) -> tuple[Path | None, str, str]:
    """(file or None for a built-in, function name, the name errors show) of a reward spec."""
    if is_file_spec(spec):
        path_text, function = (spec, "main") if spec.endswith(".py") else spec.rsplit(":", 1)
        return Path(path_text).expanduser().resolve(), function, f"{path_text}:{function}"
    if spec in BUILTINS:
        return None, BUILTIN_FUNCTION, spec
    raise RewardFunctionError(
        f"unknown reward function {spec!r}: use a built-in ({', '.join(BUILTINS)}) "
        "or path/to/file.py[:function]"
    )


def check_reward_spec(spec: str) -> None:
    """What config validation can tell without running the reward file (user code, whose imports
    may take seconds): the built-in exists, or the file exists, parses, and defines the function.
    Import errors surface when each rank loads it, still before any model loads."""
    path, function, name = _parse(spec)
    if path is None:
        return
    if not path.is_file():
        raise RewardFunctionError(
            f"reward function file {name.rsplit(':', 1)[0]} not found (looked for {path})"
        )
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError) as exc:
        raise RewardFunctionError(f"reward function file {path} does not parse: {exc}") from exc
    if function not in _bound_names(tree):
        raise RewardFunctionError(f"reward function {name}: {path} defines no {function!r}")


def check_reward_config(reward: RewardConfig) -> None:
    """Resolve ``worker.reward.reward_function`` without running the file: a missing file or
    function must stop a run before the models load and shard (minutes on a 7B model), and
    ``easyr1 config`` must report it too. ``easyr1 config`` calls it, and ``easyr1 train``'s launcher
    first thing in every process it runs in (a rank or not)."""
    if reward.reward_function is None:
        return
    try:
        check_reward_spec(reward.reward_function)
    except RewardFunctionError as exc:
        raise ConfigError(f"worker.reward.reward_function: {exc}") from exc


def _bound_names(tree: ast.Module) -> set[str]:
    """Every name a module binds anywhere (def, class, assignment, import), so that a function defined
    under ``if``/``try`` or imported from elsewhere counts; only ``exec`` tricks escape it."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def load_reward_function(spec: str, kwargs: dict[str, Any] | None = None) -> RewardFunction:
    """`spec` is a built-in name (math, r1v, dapo) or `path/file.py[:function]` (default `main`);
    `kwargs` (worker.reward.reward_function_kwargs) are passed to every call."""
    kwargs = dict(kwargs or {})
    path, function, name = _parse(spec)
    if path is not None:
        module = _import_file(path, name.rsplit(":", 1)[0])
        source = f"{path}:{function}"
    else:
        source = spec
        module = importlib.import_module(BUILTINS[spec])
    fn = getattr(module, function, None)
    if not callable(fn):
        defined = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and k[0] != "_")
        raise RewardFunctionError(
            f"reward function {name}: {module.__file__} has no function {function!r} (functions: {defined})"
        )
    reward_type = getattr(module, "REWARD_TYPE", "batch")
    if reward_type not in REWARD_TYPES:
        raise RewardFunctionError(
            f"reward function {name}: REWARD_TYPE = {reward_type!r} in {module.__file__}; "
            f"expected one of {REWARD_TYPES}"
        )
    _check_kwargs(fn, name, kwargs)
    return RewardFunction(fn, reward_type, name, source, kwargs)


def _import_file(path: Path, shown: str) -> ModuleType:
    """Import a reward file under a name unique to its path (two `math.py` files must not collide)."""
    if not path.is_file():
        raise RewardFunctionError(f"reward function file {shown} not found (looked for {path})")
    module_name = f"easyr1_reward_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise RewardFunctionError(
            f"reward function file {shown} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _check_kwargs(fn: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> None:
    """Catch misspelled or missing reward_function_kwargs at load time, not at the first step."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some callables have no introspectable signature
        return
    try:
        signature.bind(None, **kwargs)
    except TypeError as exc:
        raise RewardFunctionError(
            f"reward function {name} does not fit reward_function_kwargs {sorted(kwargs)}: {exc}"
        ) from exc
