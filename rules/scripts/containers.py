"""The project's images as source, ``containers/``: a Dockerfile per image, generated from the pins
the project already keeps, and the Apptainer definition spython converts each Dockerfile into.

Every pin has one home, and the files here are written from it, never by hand:
- the CPU image is what ``make setup`` installs: the Makefile's torch and extras, and
  pyproject.toml's dependencies and extras, as pyproject.toml pins them;
- the GPU image is the stack the GPU figures were measured with: torch, transformers and vLLM at
  the versions a named benchmark record reports (``baselines/gpu/``), everything else as
  pyproject.toml pins it.
Each image holds the engine as the build context has it (the repository at its checked-out
revision); the harness runs its own checkout's engine in it instead (``rules/scripts/engine.py``).
``make containers`` writes the files (``python -m rules.scripts.containers``); the tests fail while
a checked-in one differs from what it would write (``stale``).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from spython.main.parse.parsers import DockerParser
from spython.main.parse.writers import SingularityWriter

from rules.scripts.deps import requirements as project_requirements

REPO = Path(__file__).resolve().parents[2]
CONTAINERS = REPO / "containers"
# The record behind the headline GPU figures (docs/gpu.md): the GPU image reproduces its stack.
GPU_RECORD = REPO / "baselines/gpu/2026-12-04-h200-anchor-vllm-trl-e.json"
GPU_STACK = ("torch", "transformers", "vllm")
VENV = "/opt/easyr1/venv"
SOURCE = "/opt/easyr1/src"


@dataclass(frozen=True)
class Image:
    """One image: its base, system packages, its own pins, pyproject.toml's extras, and why."""

    name: str
    about: str  # the header's first lines: what the image is for and where its pins come from
    base: str  # an official Docker Hub image: no mirror, nothing site-specific
    apt: tuple[str, ...]
    stack: tuple[str, ...]  # pinned ahead of pyproject.toml's requirements: they decide torch's build
    extras: tuple[str, ...]


def makefile_variable(name: str) -> str:
    """A ``NAME ?= value`` default of the Makefile (what ``make setup`` uses unless told otherwise)."""
    match = re.search(rf"^{name} \?= (.+)$", (REPO / "Makefile").read_text(), re.M)
    if match is None:
        raise ValueError(f"Makefile: no `{name} ?= ...` line")
    return match.group(1).strip()


def requirements(extras: tuple[str, ...]) -> list[str]:
    """pyproject.toml's dependencies and ``extras``, in order, each at the exact version an image installs."""
    return list(dict.fromkeys(as_pinned(spec) for spec in project_requirements(extras)))


def as_pinned(spec: str) -> str:
    """An image installs exact versions: a range whose top is the tested pin (``>=a,<=b``, as the
    dependency matrix proves it) becomes ``==b``; other specs stay as written."""
    requirement = Requirement(spec)
    tops = [part.version for part in requirement.specifier if part.operator == "<="]
    return f"{requirement.name}=={tops[0]}" if tops else spec


def recorded_stack(record: Path) -> tuple[str, ...]:
    """``GPU_STACK`` pinned at the versions ``record`` ran with (2.11.0+cu130 -> 2.11.0: PyPI's
    torch 2.11.0 is that CUDA 13.0 build)."""
    versions = json.loads(record.read_text())
    return tuple(f"{name}=={versions[name].split('+')[0]}" for name in GPU_STACK)


def images() -> list[Image]:
    """The CPU and the GPU image, with their pins read from where they are kept."""
    torch, extras = makefile_variable("TORCH"), tuple(makefile_variable("EXTRAS").split(","))
    gpu = recorded_stack(GPU_RECORD)
    record = GPU_RECORD.relative_to(REPO)
    return [
        Image(
            name="cpu",
            about=f"The CPU image: what `make setup` installs ({torch} and the extras {','.join(extras)}),\n"
            "on Debian 12's Python 3.11 as on the CPU machines. Pins: the Makefile and pyproject.toml.\n"
            "PyPI's torch wheel for Linux is a CUDA build; it runs on CPUs too.",
            base="debian:12",
            apt=("python3", "python3-venv"),
            stack=(torch,),
            extras=extras,
        ),
        Image(
            name="gpu",
            about=f"The GPU image: the stack of the GPU records, {', '.join(gpu)} as\n"
            f"{record} reports them, on Ubuntu 24.04's Python 3.12;\n"
            "every other pin as pyproject.toml has it. The CUDA runtime comes with PyPI's torch wheels,\n"
            "the driver from the host (apptainer --nv); Triton compiles its launchers at run time (a C\n"
            "compiler and Python's headers).",
            base="ubuntu:24.04",
            apt=("python3", "python3-venv", "python3-dev", "build-essential"),
            stack=gpu,
            extras=("gpu", "lora", "ray"),
        ),
    ]


def dockerfile(image: Image) -> str:
    """The image's Dockerfile: the stack in layers that a change of the engine's source does not redo."""
    pinned = {Requirement(spec).name for spec in image.stack}
    specs = [
        *image.stack,
        *(spec for spec in requirements(image.extras) if Requirement(spec).name not in pinned),
    ]
    install = "".join(f' \\\n    "{spec}"' for spec in specs)
    header = "\n".join(f"# {line}" for line in image.about.splitlines())
    return f"""# Generated by `make containers` (rules/scripts/containers.py): do not edit.
{header}
# Build it from the repository's root, the build context (the image holds this checkout's engine):
#   docker build -f containers/{image.name}.Dockerfile -t easyr1-{image.name} .
#   apptainer build easyr1-{image.name}.sif containers/{image.name}.def
FROM {image.base}
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {" ".join(image.apt)} \\
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv {VENV}
ENV PATH={VENV}/bin:$PATH
RUN pip install --no-cache-dir{install}
COPY pyproject.toml README.md {SOURCE}/
COPY easyr1 {SOURCE}/easyr1
RUN pip install --no-cache-dir --no-deps {SOURCE}
"""


def definition(dockerfile_path: Path) -> str:
    """The Apptainer definition spython writes for a Dockerfile (``spython recipe`` does the same)."""
    return SingularityWriter(DockerParser(str(dockerfile_path)).recipe).convert() + "\n"


def dockerfiles() -> dict[Path, str]:
    """Each image's Dockerfile path and the text it should have."""
    return {CONTAINERS / f"{image.name}.Dockerfile": dockerfile(image) for image in images()}


def stale() -> list[Path]:
    """Files of containers/ that differ from what ``write`` makes: a Dockerfile from its pins, a
    definition from spython's conversion of the Dockerfile beside it."""
    out = []
    for path, text in dockerfiles().items():
        if not path.is_file() or path.read_text() != text:
            out.append(path)
        target = path.with_suffix(".def")
        if not path.is_file() or not target.is_file() or target.read_text() != definition(path):
            out.append(target)
    return out


def write() -> list[Path]:
    """Write every Dockerfile, then convert each into its definition; the files written."""
    CONTAINERS.mkdir(exist_ok=True)
    written = []
    for path, text in dockerfiles().items():
        path.write_text(text)
        path.with_suffix(".def").write_text(definition(path))
        written += [path, path.with_suffix(".def")]
    return written


if __name__ == "__main__":
    for written in write():
        print(f"wrote {written.relative_to(REPO)}", file=sys.stderr)
