"""The dependency matrix's jobs (rules/deps.smk): build a combination's virtualenv, run the
regression suite in it, and collect every combination into one CSV.

A combination is the project's own requirements (pyproject.toml's dependencies and the matrix's
extras) installed with its pins as constraints. A pinned package's range is lifted (from
pyproject.toml, the matrix's stack and the machine's pip constraints), so that a combination can
try a version outside the ranges (a newer torch, EasyR1's transformers 4.x) and the matrix says
what happens; pyproject.toml's ranges are then the ones the passing combinations prove (a test
checks it). A pin ``latest`` is the newest release, resolved when the combination is installed:
its row records what it got. Its virtualenv has no easyr1 in it; the harness
runs the checkout's engine there through ``engine.Virtualenv``, as any environment. Virtualenvs
are cached by the hash of what they install (``spec``) and reused by every later run, and by the
baselines matrix: a cell with ``environment: venv`` runs in a combination's virtualenv, built by
the same ``install`` into the same cache (rules/prepare.smk).

A failure is recorded, never raised: an install that fails, a test that fails, a run that dies,
a metric that drifts each become a row of the CSV with the error, and the other combinations go on.

Over 600 lines because the three jobs share one combination's spec, its cache key and the versions it
recorded; the seam, when it is split, is the virtualenvs (``install`` down to ``installed_versions``,
also used by the baselines cells) against the suite and the CSV.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from rules.scripts import engine

REPO = Path(__file__).resolve().parents[2]
# The packages whose installed versions every row reports (what a user's cluster decides).
KEY_PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "datasets",
    "math-verify",
    "tokenizers",
    "accelerate",
    "numpy",
)
LATEST = "latest"  # a pin resolved to the newest release at install time
LOSSES = ("actor/pg_loss", "actor/kl_loss")  # compared step by step with the reference
COLUMNS = (
    "combination",
    "reference",
    "status",
    "install",
    "install_error",
    "tests_passed",
    "tests_failed",
    "first_failure",
    "logprob_drift",
    "loss_drift",
    "losses",
    "install_s",
    "suite_s",
    *KEY_PACKAGES,
    "python",
    "pins",
    "env_key",
    "engine",
    "git",
    "date",
    "host",
)


def cache_root() -> Path:
    """Where combinations' virtualenvs live, shared by every checkout and working directory."""
    if os.environ.get("EASYR1_DEPS_CACHE"):
        return Path(os.environ["EASYR1_DEPS_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "easyr1" / "deps"


def uv() -> str:
    """The uv next to this interpreter (the harness extra installs it), else one on PATH."""
    beside = Path(sys.executable).with_name("uv")
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        raise RuntimeError("the dependency matrix needs uv: make setup installs it (pip install uv)")
    return found


def pip_sources() -> list[str]:
    """uv's flags for the package sources pip is configured with here (uv does not read pip's
    configuration): a combination installs from where ``make setup`` does, e.g. the local CPU
    wheel of torch that pip's find-links name. Extra indexes are searched for the best version,
    as pip does, not only the first index that has the package. See ``_lift_constraints`` for
    what becomes of pip's constraint files."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    flags = {
        "index-url": "--index-url",
        "extra-index-url": "--extra-index-url",
        "find-links": "--find-links",
        "constraint": "--constraint",
    }
    out: list[str] = []
    seen: set[tuple[str, str]] = set()
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        flag = flags.get(key.rsplit(".", 1)[-1])
        for item in value.strip("'\"").split() if flag else ():
            if (flag, item) not in seen:
                seen.add((flag, item))
                out += [flag, item]
    if "--extra-index-url" in out:
        out += ["--index-strategy", "unsafe-best-match"]
    return out


def requirements(extras: tuple[str, ...]) -> list[str]:
    """pyproject.toml's dependencies and ``extras`` as written, ranges and all (an extra naming
    ``easyr1[...]`` brings its own): a combination's pins must fall inside them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    out: list[str] = []

    def add(specs: list[str]) -> None:
        for item in specs:
            requirement = Requirement(item)
            if requirement.name == project["name"]:
                for extra in sorted(requirement.extras):
                    add(project["optional-dependencies"][extra])
            elif item not in out:
                out.append(item)

    add(project["dependencies"])
    for extra in extras:
        add(project["optional-dependencies"][extra])
    return out


def resolves(env_spec: dict[str, Any]) -> bool:
    """Whether a combination pins a package to ``latest`` (its versions are known only once installed)."""
    return LATEST in env_spec["pins"].values()


def spec(matrix: dict[str, Any], name: str) -> dict[str, Any]:
    """Everything a combination's virtualenv is made from; its hash names the cached folder."""
    extras = tuple(matrix.get("extras", []))
    tools = [s for s in requirements(("test",)) if Requirement(s).name == "pytest"]
    return {
        "python": matrix["python"],
        "stack": list(matrix["stack"]),
        "requirements": requirements(extras) + tools,
        "pins": dict(sorted(matrix["combinations"][name].items())),
    }


def env_key(env_spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(env_spec, sort_keys=True).encode()).hexdigest()[:16]


def load(path: str | Path) -> dict[str, Any]:
    """A dependency matrix file, checked against its schema (defaults filled in), as rules/deps.smk
    reads it; a ``WorkflowError`` naming the file when it does not fit."""
    from snakemake.exceptions import WorkflowError

    from easyr1.config import ConfigError, read_yaml
    from rules.scripts.inputs import check_schema

    try:
        matrix = read_yaml(path)  # invalid YAML or a key given twice: named with the file and line
    except ConfigError as error:
        raise WorkflowError(f"dependency matrix: {error}") from None
    try:
        check_schema(matrix, REPO / "configs" / "schema" / "deps.schema.yaml")
    except ConfigError as error:
        raise WorkflowError(
            f"dependency matrix {path} does not fit configs/schema/deps.schema.yaml: {error}"
        ) from None
    return matrix


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _write_failure(record: dict[str, Any], error: str, started: float, out: str) -> None:
    """An install that failed, as its record: the error, when, and after how long."""
    record.update(
        status="failed",
        error=error,
        seconds=round(time.monotonic() - started, 1),
        failed_at=datetime.now(timezone.utc).isoformat(),
    )
    Path(out).write_text(json.dumps(record, indent=1))


def install(env_spec: dict[str, Any], out: str, log: str, attempt: str = "") -> None:
    """Build the combination's virtualenv (or find it cached) and write ``out``: status, where,
    the installed versions, the error of a failed install, and ``attempt`` (the job's
    ``install_attempt`` param, which it then keeps)."""
    record: dict[str, Any] = {"pins": env_spec["pins"], "attempt": attempt}
    started = time.monotonic()
    with open(log, "w") as logfile:
        error = ""
        if resolves(env_spec):  # the newest releases today: the virtualenv is the one of what they are
            env_spec, error = resolve(env_spec, logfile)
            record["resolved"] = env_spec["pins"]
        key = env_key(env_spec)
        root = cache_root() / key
        record.update(key=key, env=str(root))
        if error:
            _write_failure(record, error, started, out)
            return
        if is_installed(root):
            logfile.write(f"cached: {root}\n")
            record["cached"] = True
        else:
            error = _build(env_spec, root, logfile)
            if error:
                _write_failure(record, error, started, out)
                return
            record["cached"] = False
    record.update(
        status="ok",
        seconds=round(time.monotonic() - started, 1),
        versions=installed_versions(root),
        finished=datetime.now(timezone.utc).isoformat(),
    )
    Path(out).write_text(json.dumps(record, indent=1))


def is_installed(root: Path) -> bool:
    """Whether the combination's virtualenv at ``root`` is complete (a build writes its spec there last)."""
    return (root / "easyr1-deps.json").is_file()


def install_attempt(path: str | Path, env_spec: dict[str, Any] | None = None) -> str:
    """The install job's param that makes it run again when its virtualenv is not there to use: after
    a failed install (tried again by every later run), or when the cached virtualenv was deleted;
    and always for a combination with ``latest`` pins (resolved again by every run). A record that
    is fine gives back the value it ran with, so its job then stays done."""
    if env_spec is not None and resolves(env_spec):
        return f"resolved at {datetime.now(timezone.utc).isoformat()}"
    if not Path(path).is_file():
        return ""
    record = json.loads(Path(path).read_text())
    if record["status"] != "ok":
        return f"after the failure at {record.get('failed_at', record['key'])}"
    if not is_installed(Path(record["env"])):
        return f"{record['env']} was gone after {record.get('finished', record['key'])}"
    return record.get("attempt", "")


def virtualenv(path: str | Path) -> tuple[engine.Virtualenv, str]:
    """The virtualenv an install record (``install``'s ``out``) names, and why it cannot run the
    engine ("" when it can): its install failed, or it was deleted since."""
    record = json.loads(Path(path).read_text())
    venv = engine.Virtualenv(Path(record["env"]))
    if record["status"] != "ok":
        return venv, f"its virtualenv did not install ({path}):\n{record.get('error', '')}"
    if not is_installed(venv.path):
        return venv, f"its virtualenv {venv.path} is gone: run again to rebuild it"
    return venv, ""


def _build(env_spec: dict[str, Any], root: Path, logfile: Any) -> str:
    """Make the virtualenv in a scratch folder and move it into place; the error text, or "".
    (Its bin/ scripts keep the scratch path in their first line: the harness runs ``bin/python -m``.)"""
    scratch = root.with_name(f"{root.name}.partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [uv(), "venv", "--python", env_spec["python"], str(scratch)],
        [uv(), "pip", "install", "--python", str(scratch / "bin" / "python")],
    ]
    try:
        for step in steps:
            if step[2] == "install":
                error = _uv(step, env_spec, scratch.with_name(scratch.name + ".files"), logfile)[1]
            else:
                error = _uv(step, None, scratch, logfile)[1]
            if error:
                return error
        (scratch / "easyr1-deps.json").write_text(json.dumps(env_spec, indent=1))
        try:
            scratch.rename(root)
        except OSError:  # another run made the same one meanwhile: keep theirs
            shutil.rmtree(scratch)
        return ""
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _uv(step: list[str], env_spec: dict[str, Any] | None, files: Path, logfile: Any) -> tuple[str, str]:
    """Run a uv command, logged; with ``env_spec``, after it the sources, the combination's pins as
    constraints and what it installs (``files``: a scratch folder for their files). (stdout, the
    error text or "")."""
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}  # the machine's interpreter, never a download
    if env_spec is not None:
        files.mkdir(parents=True, exist_ok=True)
        pinned = {name: version for name, version in env_spec["pins"].items() if version != LATEST}
        (files / "pins.txt").write_text("".join(f"{name}=={version}\n" for name, version in pinned.items()))
        (files / "requirements.in").write_text("\n".join(_requirements(env_spec)) + "\n")
        step = [
            *step,
            *_lift_constraints(pip_sources(), set(env_spec["pins"]), files),
            "--constraint",
            str(files / "pins.txt"),
            *(["-r"] if step[2] == "install" else []),  # compile takes the file as its argument
            str(files / "requirements.in"),
        ]
    try:
        logfile.write("$ " + " ".join(step) + "\n")
        if env_spec is not None:
            logfile.write((files / "requirements.in").read_text())
        logfile.flush()
        result = engine.job_child(step, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        logfile.write(result.stdout + result.stderr)
        return result.stdout, "" if result.returncode == 0 else _tail(result.stderr or result.stdout)
    finally:
        if env_spec is not None:
            shutil.rmtree(files, ignore_errors=True)


def _requirements(env_spec: dict[str, Any]) -> list[str]:
    """What a combination installs: the stack and the requirements, a pinned package's range lifted
    (its pin decides; a stack entry for it is dropped)."""
    pinned = set(env_spec["pins"])
    out = []
    for item in env_spec["stack"] + env_spec["requirements"]:
        requirement = Requirement(item)
        if requirement.name in pinned:
            if item in env_spec["stack"]:
                continue
            requirement.specifier = SpecifierSet()
        out.append(str(requirement))
    return out


def _lift_constraints(sources: list[str], pinned: set[str], files: Path) -> list[str]:
    """``sources`` with each of pip's constraint files copied without the lines on ``pinned``
    packages: a machine's cap (e.g. torch at the release on its disk) must not hide a version a
    combination asks for."""
    out = []
    for index, (flag, value) in enumerate(zip(sources[::2], sources[1::2], strict=True)):
        if flag == "--constraint" and Path(value).is_file():
            kept = [
                line
                for line in Path(value).read_text().splitlines()
                if not line.strip() or line.lstrip().startswith("#") or Requirement(line).name not in pinned
            ]
            value = str(files / f"constraints-{index}.txt")
            Path(value).write_text("\n".join(kept) + "\n")
        out += [flag, value]
    return out


def resolve(env_spec: dict[str, Any], logfile: Any) -> tuple[dict[str, Any], str]:
    """The combination with each ``latest`` pin replaced by the newest release the resolver finds
    today (``uv pip compile``), and the error text ("" when it resolved)."""
    files = cache_root() / f"resolve-{os.getpid()}"
    compiled, error = _uv(
        [uv(), "pip", "compile", "--python-version", env_spec["python"], "--no-header", "--no-annotate"],
        env_spec,
        files,
        logfile,
    )
    if error:
        return env_spec, error
    found = {}
    for line in compiled.splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, _, version = line.strip().partition("==")
            found[canonicalize_name(name)] = version.split(";")[0].strip()
    pins = {
        name: found.get(canonicalize_name(name), version) if version == LATEST else version
        for name, version in env_spec["pins"].items()
    }
    return {**env_spec, "pins": pins}, ""


def installed_versions(root: Path) -> dict[str, str]:
    """The versions the virtualenv really has (not what was asked for), and its Python."""
    probe = (
        "import importlib.metadata as m, json, platform\n"
        f"names = {list(KEY_PACKAGES)!r}\n"
        "def version(n):\n"
        "    try:\n        return m.version(n)\n"
        "    except m.PackageNotFoundError:\n        return ''\n"
        "print(json.dumps({**{n: version(n) for n in names}, 'python': platform.python_version()}))"
    )
    result = subprocess.run(
        [str(root / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def junit_counts(path: Path) -> dict[str, Any]:
    """passed / failed (failures and errors) / skipped, and the first failing test with its message."""
    root = ElementTree.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0, "first_failure": ""}
    for case in root.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            if not counts["first_failure"]:
                message = (bad.get("message") or "").strip()
                if case.get("classname"):
                    name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                else:  # a module that failed to import: pytest's message says only that, its E line why
                    name = f"{case.get('name', '').replace('.', '/')}.py"
                    errors = [
                        line[1:].strip() for line in (bad.text or "").splitlines() if line.startswith("E ")
                    ]
                    message = f"{message}: {errors[-1]}" if errors else message
                counts["first_failure"] = f"{name}: {message[:300]}"
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def prepare(run: dict[str, Any], model: str, data: str, log: str) -> None:
    """The tiny model and data every combination starts from, made natively: one folder for all,
    so that combinations differ only in their packages."""
    task = run["data"]
    for args in (
        ["tiny-model", "--arch", run["tiny"], "--out", model, "--seed", "0"],
        [
            "make-data",
            "--task",
            task["task"],
            "--out",
            data,
            "--train",
            str(task["train"]),
            "--test",
            str(task["test"]),
            "--seed",
            str(task.get("seed", 0)),
        ],
    ):
        if engine.run(args, log, 1) != 0:
            raise RuntimeError(f"easyr1 {args[0]} failed: see {log}")


def run_suite(suite: dict[str, Any], inputs: Any, out: str, log: str, threads: int) -> None:
    """In the combination's virtualenv (``inputs.installed`` says where): the test files, the
    log-probs of the fixed batch and the short GRPO run on ``inputs.model`` and ``inputs.data``;
    ``out`` gets the counts, the first failure, the log-probs and the losses. Scratch files go to
    a ``work`` folder beside ``out``."""
    record = json.loads(Path(inputs.installed).read_text())
    prepared = {"model": str(Path(inputs.model).resolve()), "data": str(Path(inputs.data).resolve())}
    result: dict[str, Any] = {"install": record["status"]}
    venv, problem = virtualenv(inputs.installed)
    if problem:
        Path(out).write_text(json.dumps(result, indent=1))
        Path(log).write_text(f"not run: {problem}\n")
        return
    work = Path(out).resolve().with_name("work")  # absolute: pytest runs from the checkout
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    python = str(venv.path / "bin" / "python")
    env = {
        **os.environ,
        "PYTHONPATH": str(engine.engine_root()),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(threads),
    }
    started = time.monotonic()
    identity = engine.describe(venv)  # the engine as this environment runs it (easyr1 version)
    result["engine"] = {key: identity[key] for key in ("fingerprint", "git")}
    with open(log, "w") as logfile:
        junit = work / "junit.xml"
        tests = [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            f"--basetemp={work / 'pytest'}",
            *suite["tests"],
        ]
        logfile.write("$ " + " ".join(tests) + "\n")
        logfile.flush()
        code = engine.job_child(
            tests, cwd=engine.engine_root(), stdout=logfile, stderr=subprocess.STDOUT, env=env
        ).returncode
        result["tests"] = (
            junit_counts(junit)
            if junit.is_file()
            else {
                "passed": 0,
                "failed": 1,
                "skipped": 0,
                "first_failure": f"pytest exited {code} without a report",
            }
        )
        shutil.rmtree(work / "pytest", ignore_errors=True)

        probe = [
            python,
            str(Path(__file__).with_name("deps_probe.py")),
            prepared["model"],
            str(work / "logprobs.json"),
        ]
        logfile.write("$ " + " ".join(probe) + "\n")
        logfile.flush()
        code = engine.job_child(probe, stdout=logfile, stderr=subprocess.STDOUT, env=env).returncode
        result["logprobs"] = json.loads((work / "logprobs.json").read_text()) if code == 0 else None

    run = suite["run"]
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(grpo_config(run, prepared, str(work / "run"))))
    code = engine.run(["train", f"config={config}"], log, threads, venv)
    metrics = work / "run" / "metrics.jsonl"
    steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    result["losses"] = [[step.get(name) for name in LOSSES] for step in steps] if code == 0 else None
    result["run_error"] = (
        "" if code == 0 else f"easyr1 train exited {code}: {_tail(Path(log).read_text(), 3)}"
    )
    result["seconds"] = round(time.monotonic() - started, 1)
    Path(out).write_text(json.dumps(result, indent=1))


def grpo_config(run: dict[str, Any], prepared: dict[str, str], run_dir: str) -> dict[str, Any]:
    """The GRPO run's engine config: the engine file, fp32 everywhere (numbers comparable across
    combinations), the prepared model and data, the matrix's overrides, the harness's keys."""
    config = yaml.safe_load((REPO / run["engine"]).read_text()) or {}
    overrides = dict(run.get("overrides", {}))
    reward = overrides.get("worker.reward.reward_function", "")
    if ":" in reward and (REPO / reward.rsplit(":", 1)[0]).is_file():  # a repository file: its full path
        overrides["worker.reward.reward_function"] = f"{REPO / reward}"
    keys = {
        "worker.actor.fsdp.torch_dtype": "fp32",
        "worker.actor.fsdp.mp_param_dtype": "fp32",
        "worker.ref.fsdp.torch_dtype": "fp32",
        "worker.ref.fsdp.mp_param_dtype": "fp32",
        **overrides,
        "data.train_files": f"{prepared['data']}@train",
        "data.val_files": f"{prepared['data']}@test",
        "worker.actor.model.model_path": prepared["model"],
        "trainer.max_steps": run["steps"],
        "trainer.n_gpus_per_node": run.get("ranks", 2),
        "trainer.logger": ["file"],
        "trainer.save_checkpoint_path": run_dir,
        "trainer.save_freq": -1,
        "trainer.experiment_name": "deps",
    }
    for dotted, value in keys.items():
        *parents, leaf = dotted.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


def drift(values: Any, reference: Any) -> float | None:
    """Max |difference| of two equally shaped nests of lists of numbers; inf where their shapes
    differ; None when either is missing."""
    if values is None or reference is None:
        return None
    return _max_difference(values, reference)


def _max_difference(a: Any, b: Any) -> float:
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return float("inf")
        return max((_max_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if a is None or b is None or isinstance(a, list) or isinstance(b, list):
        return 0.0 if a is None and b is None else float("inf")
    return abs(float(a) - float(b))


def status(
    name: str,
    matrix: dict[str, Any],
    installed: dict[str, Any],
    suite: dict[str, Any],
    reference: dict[str, Any],
) -> tuple[str, float | None, float | None]:
    """(status, log-prob drift, loss drift): ok, or failed: with every reason found."""
    if installed["status"] != "ok":
        return "failed: install", None, None
    tolerance = matrix["suite"]["tolerance"]
    reasons = []
    if suite["tests"]["failed"]:
        reasons.append(f"{suite['tests']['failed']} test(s) failed")
    if suite.get("logprobs") is None:
        reasons.append("log-prob probe")
    if suite.get("losses") is None:
        reasons.append("GRPO run")
    logprob_drift = drift(suite.get("logprobs"), reference.get("logprobs"))
    loss_drift = drift(suite.get("losses"), reference.get("losses"))
    if name != matrix["reference"] and (reference.get("logprobs") is None or reference.get("losses") is None):
        reasons.append("no reference metrics")
    if logprob_drift is not None and logprob_drift > tolerance["logprobs"]:
        reasons.append(f"log-probs drift {logprob_drift:.1e} > {tolerance['logprobs']:.0e}")
    if loss_drift is not None and loss_drift > tolerance["loss"]:
        reasons.append(f"loss drift {loss_drift:.1e} > {tolerance['loss']:.0e}")
    return ("failed: " + ", ".join(reasons) if reasons else "ok"), logprob_drift, loss_drift


def collect(
    matrix: dict[str, Any], names: list[str], installs: list[str], suites: list[str], out: str
) -> None:
    """One row per combination, with provenance (date, git revision, host, installed versions)."""
    loaded = {
        name: (json.loads(Path(i).read_text()), json.loads(Path(s).read_text()))
        for name, i, s in zip(names, installs, suites, strict=True)
    }
    reference = loaded[matrix["reference"]][1]
    native = engine.describe()  # for a combination that never ran
    date = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    rows = []
    for name, (installed, suite) in loaded.items():
        state, logprob_drift, loss_drift = status(name, matrix, installed, suite, reference)
        tests = suite.get("tests", {})
        versions = installed.get("versions", {})
        first_failure = tests.get("first_failure") or suite.get("run_error", "")
        rows.append(
            {
                "combination": name,
                "reference": name == matrix["reference"],
                "status": state,
                "install": installed["status"],
                "install_error": installed.get("error", ""),
                "tests_passed": tests.get("passed", ""),
                "tests_failed": tests.get("failed", ""),
                "first_failure": first_failure,
                "logprob_drift": "" if logprob_drift is None else f"{logprob_drift:.2e}",
                "loss_drift": "" if loss_drift is None else f"{loss_drift:.2e}",
                "losses": json.dumps(suite.get("losses")) if suite.get("losses") else "",
                "install_s": installed.get("seconds", ""),
                "suite_s": suite.get("seconds", ""),
                **{package: versions.get(package, "") for package in KEY_PACKAGES},
                "python": versions.get("python", ""),
                "pins": " ".join(f"{k}=={v}" for k, v in installed["pins"].items()),
                "env_key": installed["key"],
                "engine": suite.get("engine", native)["fingerprint"],
                "git": suite.get("engine", native)["git"],
                "date": date,
                "host": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)",
            }
        )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def check(path: str) -> int:
    """CI's verdict on a collected CSV: every combination's failure printed, 1 when any failed."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        print(f"{row['combination']}: {row['status']}")
        for detail in (row["install_error"], row["first_failure"]):
            if detail:
                print("  " + detail.replace("\n", "\n  "))
    return 1 if any(row["status"] != "ok" for row in rows) else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "check":
        sys.exit("usage: python -m rules.scripts.deps check DEPS.csv")
    sys.exit(check(sys.argv[2]))
