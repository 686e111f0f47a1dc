"""An image for the Apptainer stand-in (``tests/bin/apptainer``), made from this machine's own stack.

No image can be built here (no Apptainer, no registry of images), so the tests lay out what
``containers/cpu.def`` builds, as an Apptainer sandbox folder: the operating system, the test's
Python environment where the definition puts it (``/opt/easyr1/venv``), the definition's
``%environment`` where Apptainer keeps it, and the definition itself. Hard links, not copies: a
few seconds for gigabytes. The test's own checkout, working directories and data are not in it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from itertools import takewhile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "bin"  # put first on PATH, it is `apptainer`
DEFINITION = REPO / "containers" / "cpu.def"
VENV = "opt/easyr1/venv"  # where containers/cpu.def installs the stack


def require_bubblewrap() -> None:
    """The stand-in runs on bubblewrap (Debian's `bubblewrap`). Without it these tests are skipped,
    so that `make test` runs anywhere, except in CI (.ci/run installs it and sets EASYR1_CI=1),
    where a missing bubblewrap fails them rather than letting them pass unrun."""
    if shutil.which("bwrap") is None:
        message = "the Apptainer stand-in needs bubblewrap: apt-get install bubblewrap"
        if os.environ.get("EASYR1_CI") == "1":
            raise RuntimeError(message)
        import pytest

        pytest.skip(message)


def _link_tree(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(source), str(dest)], check=True)


def environment_section(definition: str) -> str:
    """A definition file's ``%environment`` lines (what Apptainer writes to 90-environment.sh)."""
    lines = definition.split("%environment\n", 1)[1].splitlines()
    return "".join(f"{line}\n" for line in takewhile(lambda line: not line.startswith("%"), lines))


def build_image(dest: Path) -> Path:
    """The sandbox image at ``dest`` (built once: an existing one is reused)."""
    if (dest / ".singularity.d").is_dir():
        return dest
    if sys.prefix == sys.base_prefix:
        raise RuntimeError("run the tests from a virtual environment (make setup makes .venv)")
    scratch = dest.with_name(dest.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    _link_tree(Path("/usr"), scratch / "usr")
    for name in ("bin", "lib", "lib64", "sbin"):  # links into /usr where /usr is merged
        host = Path("/", name)
        if host.is_symlink():
            os.symlink(os.readlink(host), scratch / name)
        elif host.is_dir():
            _link_tree(host, scratch / name)
    subprocess.run(["cp", "-a", "/etc", str(scratch / "etc")], check=True)  # small; may hold mounts
    base = Path(sys.base_prefix).resolve()
    if not base.is_relative_to("/usr"):  # an interpreter outside /usr (pyenv): the venv links to it
        _link_tree(base, scratch / base.relative_to("/"))
    _link_tree(Path(sys.prefix), scratch / VENV)
    for name in ("dev", "proc", "sys", "tmp"):
        (scratch / name).mkdir()
    meta = scratch / ".singularity.d"
    (meta / "env").mkdir(parents=True)
    definition = DEFINITION.read_text()
    (meta / "env" / "90-environment.sh").write_text(environment_section(definition))
    (meta / "Singularity").write_text(definition)
    scratch.rename(dest)
    return dest


def path_with_stand_in() -> str:
    """PATH with the stand-in first."""
    return f"{STAND_IN}{os.pathsep}{os.environ['PATH']}"
