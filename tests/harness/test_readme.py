"""Every command in README.md and docs/*.md, checked without a GPU or a cluster: make targets exist in
the Makefile, ``easyr1`` commands parse with the CLI's own argparse parsers (``easyr1.cli.flag_parser``)
and their config arguments pass the checks ``easyr1 train`` runs, paths and Snakemake profiles,
config files and snakefiles exist, links and their anchors resolve, and the cheap commands
(``easyr1 config``, ``--explain``, ``--help``) run."""

from __future__ import annotations

import contextlib
import glob
import io
import re
import shlex
from pathlib import Path

import pytest

from easyr1.cli import COMMANDS, flag_parser, main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = ("bash", "sh", "shell", "console")
# A committed path starts with one of these; runs/, models/, data/, checkpoints/ are what commands write.
TRACKED = (
    "configs/",
    "examples/",
    "rules/",
    "bench/",
    "tests/",
    "containers/",
    ".ci/",
    "easyr1/",
    "reports/",
)
TRACKED += (
    "assets/",
    "baselines/",
    "docs/",
    "Snakefile",
    "Makefile",
    "DESIGN.md",
    "README.md",
    "pyproject.toml",
)
# What a reader fills in: an upper-case word (DIR, KEY=VALUE, YOUR/..., N; not README.md), or a folder
# of their own machine.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]+\b(?!\.)|^[A-Z]$|^(/path/|/scratch/|/mnt/)|\.\.\.")
SNAKEMAKE_FILES = {"--configfile": "configfile", "-s": "snakefile", "--snakefile": "snakefile"}


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line number, body) of each fenced code block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = re.match(r"^(`{3,})(\S*)\s*$", lines[i])
        if opening:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(opening[1]))
            blocks.append((opening[2], i + 2, "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return blocks


def commands(body: str) -> list[list[str]]:
    """The shell commands of a block: continuations joined, comments dropped, split at && ; and |."""
    out: list[list[str]] = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in words + [";"]:
            if word in ("&&", ";", "|", "||"):
                if command:
                    out.append(command)
                command = []
            else:
                command.append(word)
    return out


def placeholder(word: str) -> bool:
    return bool(PLACEHOLDER.search(word))


def check_path(word: str) -> str | None:
    """A committed path that is missing (globs and ``{name}`` patterns must match something)."""
    path = word.split("@")[0].rstrip(".,:;")
    if not path.startswith(TRACKED) or placeholder(path) or path.startswith(".../"):
        return None
    pattern = re.sub(r"\{[^}]*\}", "*", path)
    if any(ch in pattern for ch in "*?["):
        return None if glob.glob(str(ROOT / pattern)) else f"no file matches {word}"
    return None if (ROOT / path).exists() else f"no such path: {word}"


def run_in_process(argv: list[str]) -> tuple[int, str]:
    """``easyr1 ARGV`` in this process: its exit status and what it wrote to stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own exits (a bad flag: 2)
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue().strip()


def check_config_args(args: list[str]) -> list[str]:
    """Config arguments (``config=FILE KEY=VALUE``) through ``easyr1 config``: the checks every rank of
    ``easyr1 train`` runs, for the ranks the run asks for; placeholders are left out."""
    args = [a for a in args if not placeholder(a)]
    code, err = run_in_process(["config", *args])
    return [] if code == 0 else [f"easyr1 config {' '.join(args)}: {err.splitlines()[-1] if err else code}"]


def check_easyr1(argv: list[str]) -> list[str]:
    """``easyr1 COMMAND ARGS``: parsed by the command's own parser, run where it is cheap."""
    if not argv or argv[0] in ("-h", "--help"):
        return [] if run_in_process(argv or ["--help"])[0] == 0 else ["easyr1 --help failed"]
    command, args = argv[0], argv[1:]
    if command not in COMMANDS:
        return [f"easyr1 {command}: no such command (easyr1 --help lists {', '.join(COMMANDS)})"]
    if any(a in ("-h", "--help") for a in args) or args[:1] == ["--explain"]:
        code, err = run_in_process(argv)
        return [] if code == 0 else [f"easyr1 {' '.join(argv)}: exit {code}: {err}"]
    problems = [p for a in args if a.startswith("config=") and (p := check_path(a.removeprefix("config=")))]
    parser = flag_parser(command, args)
    if parser is None:
        return problems + check_config_args(args)
    flags = [a for a in args if not placeholder(a)]
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            if command == "memory":
                _, config_args = parser.parse_known_args(flags)
            else:
                config_args = list(getattr(parser.parse_args(flags), "overrides", None) or [])
    except SystemExit:
        return problems + [f"easyr1 {' '.join(argv)}: {err.getvalue().strip().splitlines()[-1]}"]
    if config_args:
        problems += check_config_args(config_args)
    return problems


def check_flags(command: str, words: list[str]) -> list[str]:
    """An inline ``easyr1 COMMAND --flag ...`` in prose: the command exists and takes each flag."""
    if command not in COMMANDS:
        return [f"easyr1 {command}: no such command"]
    parser = flag_parser(command, words)
    known = set(parser._option_string_actions) if parser else {"--explain", "--help", "-h"}
    return [
        f"easyr1 {command}: no flag {w}" for w in words if w.startswith("-") and w.split("=")[0] not in known
    ]


def check_snakemake(args: list[str]) -> list[str]:
    problems, i = [], 0
    while i < len(args):
        word = args[i]
        value = args[i + 1] if i + 1 < len(args) else ""
        if word == "--profile" and not placeholder(value):
            if not (ROOT / value / "config.yaml").is_file():
                problems.append(f"snakemake --profile {value}: no {value}/config.yaml")
        elif word in SNAKEMAKE_FILES and not placeholder(value):
            if not (ROOT / value).is_file():
                problems.append(f"snakemake {word} {value}: no such {SNAKEMAKE_FILES[word]}")
        i += 1
    return problems


def check_command(words: list[str]) -> list[str]:
    """One shell command of a code block."""
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value before the program
        words = words[1:]
    if not words:
        return []
    problems = [p for w in words if (p := check_path(w))]
    program = words[0]
    for i, word in enumerate(words):
        if " " in word:  # a command line passed as one word (sbatch --wrap "...")
            problems += [p for nested in commands(word) for p in check_command(nested)]
        if i and Path(word).name == "easyr1" and program in ("srun", "torchrun", "env", "timeout"):
            return problems + check_easyr1(words[i + 1 :])
    if program == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        problems += [f"make {t}: no such target in the Makefile" for t in targets if t not in make_targets()]
    elif Path(program).name == "easyr1":
        problems += check_easyr1(words[1:])
    elif Path(program).name in ("python", "python3") and words[1:3] in (
        ["-m", "easyr1"],
        ["-m", "easyr1.cli"],
    ):
        problems += check_easyr1(words[3:])
    elif Path(program).name == "snakemake":
        problems += check_snakemake(words[1:])
    return problems


def check_inline(text: str) -> list[str]:
    """Prose: inline code that names a path, a make target or easyr1 flags."""
    problems = []
    for span in re.findall(r"`([^`]+)`", text):
        words = span.split()
        if not words:
            continue
        if words[0] == "make" and len(words) > 1 and re.fullmatch(r"[a-z-]+", words[1]):
            if words[1] not in make_targets():
                problems.append(f"`{span}`: no make target {words[1]}")
        elif Path(words[0]).name == "easyr1" and len(words) > 1 and not placeholder(words[1]):
            problems += check_flags(words[1], words[2:])
        elif len(words) == 1 and (problem := check_path(words[0])):
            problems.append(problem)
    return problems


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as dashes."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def check_links(page: Path, text: str) -> list[str]:
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            problems.append(f"link {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"link {target}: no heading with that anchor")
    return problems


def page_problems(page: Path, text: str) -> list[str]:
    """Everything wrong with a page's commands, paths and links, each with where it is."""
    blocks = fenced_blocks(text)
    prose = re.sub(r"^(`{3,})\S*\s*$.*?^\1\s*$", "", text, flags=re.M | re.S)
    problems = [f"{page.name}: {p}" for p in check_links(page, prose) + check_inline(prose)]
    for language, line, body in blocks:
        if language in SHELL_BLOCKS:
            problems += [f"{page.name}:{line}: {p}" for words in commands(body) for p in check_command(words)]
    return problems


def test_readme_names_the_docs_and_ci_runs_its_test_command() -> None:
    """README's two commands, the docs it links, and .ci/run calling the README's test command."""
    readme = (ROOT / "README.md").read_text()
    first_block = next(body for language, _, body in fenced_blocks(readme) if language in SHELL_BLOCKS)
    assert [words[:2] for words in commands(first_block)] == [["make", "baselines"], ["make", "test"]]
    assert re.search(r"^(\S+=\S+ )*make test$", (ROOT / ".ci/run").read_text(), flags=re.M)
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert linked == {p.name for p in PAGES[1:]}, "every docs/ page linked from the README, and only those"
    assert len(readme.splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_and_path_of_the_page_holds(page: Path) -> None:
    assert page_problems(page, page.read_text()) == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("make baseline", "no such target"),
        (".venv/bin/easyr1 trian config=examples/config.yaml", "no such command"),
        (".venv/bin/easyr1 tiny-model --arch qwen2 --out models/m --sise 7b", "unrecognized arguments"),
        (".venv/bin/easyr1 tiny-model --arch gpt2 --out models/m", "invalid choice"),
        (".venv/bin/easyr1 train config=examples/config.yaml worker.rollout.nn=4", "worker.rollout.n"),
        (".venv/bin/easyr1 train config=examples/nope.yaml", "no such path"),
        (
            ".venv/bin/easyr1 memory config=examples/config.yaml --gpu-memory 40 data.rollout_batch=8",
            "rollout_batch",
        ),
        (".venv/bin/easyr1 bench --workload anchor --trl worker.actor.optim.lrr=1e-6", "optim.lrr"),
        (".venv/bin/easyr1 config --explain worker.rollout.no_such_key", "exit 2"),
        ("srun -N 2 .venv/bin/easyr1 merge --local-dir x --dtpye bf16", "unrecognized arguments"),
        ('sbatch --wrap ".venv/bin/easyr1 trian"', "no such command"),
        (
            "snakemake --profile configs/profiles/nope --configfile configs/matrix/cpu.yaml",
            "no configs/profiles/nope",
        ),
        (
            "snakemake --profile configs/profiles/local --configfile configs/matrix/gone.yaml",
            "no such configfile",
        ),
        ("snakemake -s rules/gone.smk --profile configs/profiles/local", "no such snakefile"),
        ("apptainer build easyr1-gpu.sif containers/gone.def", "no such path"),
    ],
)
def test_a_broken_command_is_caught(line: str, problem: str) -> None:
    text = f"```bash\n{line}\n```\n"
    problems = page_problems(ROOT / "README.md", text)
    assert problems and problem in " ".join(problems), problems


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("See [the docs](docs/nope.md).", "no such file"),
        ("See [resume](docs/resume.md#no-such-heading).", "no heading"),
        ("Run `make recrod` to keep it.", "no make target recrod"),
        ("`easyr1 merge --verfy` checks it.", "no flag --verfy"),
        ("The matrix is `configs/matrix/gone.yaml`.", "no such path"),
    ],
)
def test_broken_prose_is_caught(text: str, problem: str) -> None:
    problems = page_problems(ROOT / "README.md", text)
    assert problems and problem in " ".join(problems), problems


def test_a_good_command_passes() -> None:
    """The checks hold real commands (so a failing page test is the page's fault, not the checker's)."""
    text = (
        "```bash\nmake test\n"
        ".venv/bin/easyr1 tiny-model --arch qwen2 --out models/m   # a comment\n"
        ".venv/bin/easyr1 memory config=examples/config.yaml --model qwen2:7b --gpu-memory 40\n"
        "snakemake --profile configs/profiles/local --configfile /path/my.yaml -d DIR\n```\n"
        "`easyr1 merge --verify` and `configs/matrix/*.yaml`, [docs](docs/resume.md#the-harness).\n"
    )
    assert page_problems(ROOT / "README.md", text) == []
