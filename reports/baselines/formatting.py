"""Values as the page prints them, Markdown tables, and figures as PNG bytes."""

from __future__ import annotations

import io
import math
from statistics import mean, stdev
from typing import Any

import matplotlib.pyplot as plt

PNG = {"Software": None}  # no matplotlib version in the files: the same records give the same bytes


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def num(value: Any, fmt: str, unit: str = "") -> str:
    return "-" if missing(value) else f"{value:{fmt}}{unit}"


def integer(value: Any) -> str:
    return "-" if missing(value) else str(int(value))


def pct(value: Any) -> str:
    return "-" if missing(value) else f"{100 * value:.1f}%"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def mean_std(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:{fmt}}"
    return f"{mean(values):{fmt}} ± {stdev(values):{fmt.lstrip('+')}}"


def lora_label(value: Any) -> str:
    return f" LoRA {int(value)}" if not missing(value) and int(value) > 0 else ""


def setting(value: Any) -> str:
    return "-" if missing(value) else str(value)


def png_bytes(fig: plt.Figure) -> bytes:
    """A figure's PNG, kept in memory until the page is written with it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata=PNG)
    plt.close(fig)
    return buffer.getvalue()
