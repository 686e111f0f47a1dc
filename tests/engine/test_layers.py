"""The engine's layers, read from the source: no import cycle, no import that goes up a layer.

The graph is every ``import`` of ``easyr1/`` (those inside functions too), with the implicit ones:
importing ``easyr1.a.b`` runs ``easyr1/a/__init__.py`` first. ``LAYERS`` is the one table of the
layers, bottom to top (``DESIGN.md``, "Layers", shows the same). The harness (``rules/``,
``reports/``) and ``bench/`` sit above the engine and import only what ``HARNESS_ENTRY_POINTS`` /
``BENCH_ENTRY_POINTS`` name, and never a private (underscore) name. And a name is imported from the
module that defines it, never through another that happens to import it (no re-exports).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Bottom to top. A module belongs to the layer of the longest prefix that names it; every package's
# ``__init__`` and every ``config`` module belong to "base", whatever package they are in, so that
# reading a config never imports a component.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "easyr1.config",
            "easyr1.config_checks",
            "easyr1.config_docs",
            "easyr1.files",
            "easyr1.yaml_io",
            "easyr1.distributed",
            "easyr1.provenance",
        ),
    ),
    (
        "components",
        (
            "easyr1.data",
            "easyr1.models",
            "easyr1.algorithms",
            "easyr1.rewards",
            "easyr1.memory",
            "easyr1.activations",
            "easyr1.telemetry",
            "easyr1.metrics",
            "easyr1.profiling",
            "easyr1.stalls",
            "easyr1.loggers",
            "easyr1.hub",
            "easyr1.workloads",
        ),
    ),
    ("workers", ("easyr1.workers", "easyr1.experience")),
    ("rollout", ("easyr1.rollout",)),
    (
        "trainer",
        (
            "easyr1.trainer",
            "easyr1.checkpoint",
            "easyr1.safe_dcp",
            "easyr1.export",
            "easyr1.resume",
            "easyr1.run_folder",
            "easyr1.evaluate",
            "easyr1.runlock",
        ),
    ),
    ("launch", ("easyr1.launch",)),
    (
        "cli",
        (
            "easyr1.cli",
            "easyr1.__main__",
            "easyr1.bench",
            "easyr1.bench_peer",
            "easyr1.memory_measure",
            "easyr1.memory_cli",
            "easyr1.demo",
        ),
    ),
]

# What the harness may import from the engine (DESIGN.md, "Rules of the house"): the config schema
# and its checks, the memory estimator (and the model shapes it reads) with the named workloads' configs it estimates, provenance,
# and the dataset path syntax the config checks use. All of them compute without running anything.
HARNESS_ENTRY_POINTS = (
    "easyr1.config",
    "easyr1.config_checks",
    "easyr1.*.config",
    "easyr1.memory",
    "easyr1.activations",  # the estimator's recomputation plans (a record's, replayed)
    "easyr1.models.architecture",
    "easyr1.workloads",
    "easyr1.provenance",
    "easyr1.data.paths",
)
# bench/ measures the engine's pieces beside a peer: besides the harness's entry points, the named
# workloads (easyr1.bench) and the public names of the modules a benchmark times.
BENCH_ENTRY_POINTS = (*HARNESS_ENTRY_POINTS, "easyr1.*")


def engine_modules(root: Path = REPO) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``)."""
    out = {}
    for path in sorted((root / "easyr1").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def imported_names(tree: ast.AST, package: str) -> list[tuple[str, list[str], int]]:
    """(module, names taken from it, line) for every import in ``tree``, relative ones resolved."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.append((base, [alias.name for alias in node.names], node.lineno))
    return out


def import_graph(root: Path = REPO) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line}, with the package ``__init__`` each import runs."""
    modules = engine_modules(root)

    def targets(dotted: str) -> list[str]:
        """The modules importing ``dotted`` runs: it (or the module holding the name) and its packages."""
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        parts = dotted.split(".")
        return [".".join(parts[:i]) for i in range(1, len(parts) + 1)] if dotted else []

    graph: dict[str, dict[str, int]] = {}
    for name, (path, package) in modules.items():
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(), str(path))
        for module, names, line in imported_names(tree, name if package else name.rpartition(".")[0]):
            if not module.startswith("easyr1"):
                continue
            found = targets(module) + [t for n in names for t in targets(f"{module}.{n}")]
            for target in found:
                if target != name and not name.startswith(target + "."):  # its own packages ran already
                    edges.setdefault(target, line)
        graph[name] = edges
    return graph


def layer_of(module: str, modules: dict[str, tuple[Path, bool]]) -> int:
    if modules[module][1] or module.rpartition(".")[2] == "config":
        return 0
    best, index = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    assert index is not None, f"{module} is in no layer: add it to LAYERS (and DESIGN.md)"
    return index


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_module_has_a_layer() -> None:
    modules = engine_modules()
    for module in modules:
        layer_of(module, modules)


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_goes_up_a_layer() -> None:
    modules = engine_modules()
    upward = []
    for module, edges in import_graph().items():
        low = layer_of(module, modules)
        for target, line in edges.items():
            high = layer_of(target, modules)
            if high > low:
                path = modules[module][0].relative_to(REPO)
                upward.append(
                    f"{path}:{line}: {module} ({LAYERS[low][0]}) imports {target} ({LAYERS[high][0]})"
                )
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def _harness_imports(folder: str) -> list[tuple[Path, int, str, list[str]]]:
    """(file, line, module, names) of every ``easyr1`` import in a folder's Python and Snakemake files."""
    out = []
    for path in sorted((REPO / folder).rglob("*")):
        if path.suffix == ".py":
            tree = ast.parse(path.read_text(), str(path))
            for module, names, line in imported_names(tree, ""):
                if module.startswith("easyr1"):
                    out.append((path, line, module, names))
        elif path.suffix == ".smk" or path.name == "Snakefile":
            for i, text in enumerate(path.read_text().splitlines(), 1):
                if m := re.match(r"\s*from (easyr1[\w.]*) import (.+)", text):
                    out.append(
                        (path, i, m[1], [n.strip() for n in m[2].split("#")[0].strip("() ").split(",")])
                    )
                elif m := re.match(r"\s*import (easyr1[\w.]*)", text):
                    out.append((path, i, m[1], []))
    return out


def _allowed(module: str, patterns: tuple[str, ...]) -> bool:
    return any(re.fullmatch(re.escape(p).replace(r"\*", r"[\w.]+"), module) for p in patterns)


@pytest.mark.parametrize(
    ("folder", "entry_points"),
    [("rules", HARNESS_ENTRY_POINTS), ("reports", HARNESS_ENTRY_POINTS), ("bench", BENCH_ENTRY_POINTS)],
)
def test_harness_uses_only_entry_points(folder: str, entry_points: tuple[str, ...]) -> None:
    bad = []
    for path, line, module, names in _harness_imports(folder):
        where = f"{path.relative_to(REPO)}:{line}"
        if not _allowed(module, entry_points):
            bad.append(f"{where}: imports {module}, not an entry point of the engine")
        bad += [f"{where}: imports the private name {module}.{n}" for n in names if n.startswith("_")]
    assert not bad, "\n".join(bad)


def _defined_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (not those it imports)."""
    out: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                out.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
            elif isinstance(node, (ast.If, ast.Try)):
                walk(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])

    walk(tree.body)
    return out


def test_names_come_from_the_module_that_defines_them() -> None:
    """No re-exports: every ``from easyr1.X import name`` (engine, tests, harness, bench) names the
    module that defines ``name``, so a moved name leaves no alias behind."""
    modules = engine_modules()
    defined = {name: _defined_names(ast.parse(path.read_text())) for name, (path, _) in modules.items()}
    found = [
        (path, line, module, names)
        for folder in ("easyr1", "tests")
        for path in sorted((REPO / folder).rglob("*.py"))
        for module, names, line in imported_names(ast.parse(path.read_text()), "")
    ]
    found += [imp for folder in ("rules", "reports", "bench") for imp in _harness_imports(folder)]
    elsewhere = [
        f"{path.relative_to(REPO)}:{line}: {module}.{name}"
        for path, line, module, names in found
        if module in modules
        for name in names
        if name not in defined[module] and f"{module}.{name}" not in modules
    ]
    assert not elsewhere, "names imported from a module that does not define them:\n" + "\n".join(elsewhere)


def test_the_config_imports_no_component() -> None:
    """What the harness imports to check a matrix loads no torch, transformers, vLLM or datasets."""
    code = (
        "import sys, easyr1.config, easyr1.config_checks, easyr1.config_docs, easyr1.rollout.config, easyr1.data.paths\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'vllm', 'datasets'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_design_shows_the_same_layers() -> None:
    """DESIGN.md's "Layers" names the layers of ``LAYERS``, in the same order."""
    design = (REPO / "DESIGN.md").read_text()
    section = design[design.index("## Layers") :].split("\n## ", 1)[0]
    assert re.findall(r"^\d+\. \*\*(\w+)\*\*", section, re.M) == [name for name, _ in LAYERS]


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    """The checks find a cycle closed inside a function, an upward import, a package ``__init__``'s
    import, and a private name: the test can fail."""
    pkg = tmp_path / "easyr1"
    (pkg / "models").mkdir(parents=True)
    (pkg / "workers").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("from easyr1.models import lora\n")
    (pkg / "models" / "lora.py").write_text("def f():\n    from easyr1.workers.fsdp import wrap\n")
    (pkg / "workers" / "__init__.py").write_text("")
    (pkg / "workers" / "fsdp.py").write_text("from easyr1.models.lora import f\n")
    graph = import_graph(tmp_path)
    assert graph["easyr1.models.lora"] == {"easyr1.workers": 2, "easyr1.workers.fsdp": 2}
    assert "easyr1.models.lora" in graph["easyr1.models"]
    assert find_cycle(graph) is not None
    modules = engine_modules(tmp_path)
    assert layer_of("easyr1.models", modules) == 0 < layer_of("easyr1.models.lora", modules)
    assert not _allowed("easyr1.workers.fsdp", HARNESS_ENTRY_POINTS) and _allowed(
        "easyr1.data.config", HARNESS_ENTRY_POINTS
    )
