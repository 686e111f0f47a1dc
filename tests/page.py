"""Reading the generated baselines page back in tests: its markdown tables as rows."""

from __future__ import annotations


def markdown_table(page: str, heading: str) -> list[dict[str, str]]:
    """The first markdown table under ``## heading``, as rows keyed by its header."""
    section = page.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines: list[str] = []
    for line in section.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    split = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    return [dict(zip(split(lines[0]), split(line), strict=True)) for line in lines[2:]]
