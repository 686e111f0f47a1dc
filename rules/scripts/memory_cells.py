"""The cells of the hardware workflow (``rules/memory.smk``): EasyR1's table's cells that fit the
GPUs on hand, the others as simulated ranks (rank 0 of the cell's GPUs alone on one GPU), and cells
on whole GPUs, each as the ``easyr1 bench`` arguments that measure it."""

from __future__ import annotations

from typing import Any

from easyr1.config import ConfigError, load_config


def table() -> list[tuple[str, str, int, int]]:
    """EasyR1's table (the page's copy, ``reports/hardware.py``) as (size, precision, GPUs, GB) cells."""
    from reports.hardware import EASYR1_TABLE, PRECISION, SIZES

    return [
        (size, PRECISION[row], gpus, gb)
        for row, counts in EASYR1_TABLE.items()
        for size, (gpus, gb) in zip(SIZES, counts, strict=True)
    ]


def _cell(
    size: str,
    precision: str,
    gpus: int,
    cap: int | None,
    config: dict[str, Any],
    variant: str | None = None,
    simulated: bool = False,
) -> dict[str, Any]:
    workload = "smoke_memory" if size == "tiny" else f"easyr1_{size}"
    notes = f"rules/memory.smk: {size} {precision} on {gpus} GPU(s) " + (
        f"capped to {cap} GiB" if cap else "whole"
    )
    # Simulated ranks: rank 0 of the cell's GPUs on one GPU, its model a folder without weights (each
    # rank draws its own shards); the Hugging Face rollout whatever ``backend`` says (vLLM is refused).
    layout = ["--gpus", "1", "--simulated-ranks", str(gpus)] if simulated else ["--gpus", str(gpus)]
    args = [
        "bench",
        "--workload",
        workload,
        "--precision",
        precision,
        *layout,
        "--steps",
        str(config["steps"]),
        "--backend",
        "hf" if simulated else config["backend"],
        "--notes",
        notes + (" as simulated ranks" if simulated else "") + (f", {variant}" if variant else ""),
    ]
    if cap is not None:
        args += ["--gpu-memory", str(cap)]
    if variant:  # config overrides (KEY=VALUE) last: the bench's positional arguments
        args += config["whole_gpu"]["variants"][variant]
    on_gpus = size != "tiny"  # the smoke workload runs on CPU ranks (tests)
    used = 1 if simulated else gpus
    return {
        "size": size,
        "model": f"runs/prepared/model/qwen2-{size}" + ("-config" if simulated else ""),
        "args": args,
        "gpu": used if on_gpus else 0,
        "threads": used * config["resources"].get("cpus_per_gpu", 8) if on_gpus else 1,
    }


def expand_cells(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Cell name -> its size, model folder, bench arguments and resources: ``{size}-{precision}-{gpus}x{GB}g``
    for the table's cells of at most ``table_gpus`` GPUs, ``{size}-{precision}-{gpus}x{GB}g-simulated``
    for the others where ``simulated_ranks`` is on (rank 0 of the cell's GPUs on one GPU),
    ``{size}-{precision}-whole`` for whole GPUs, and ``{size}-{precision}-whole-{variant}`` for each
    of ``whole_gpu.variants`` (EasyR1's example with that variant's overrides: what a feature saves
    is the difference)."""
    cells = {}
    for size, precision, gpus, gb in table():
        if gpus <= config["table_gpus"]:
            cells[f"{size}-{precision}-{gpus}x{gb}g"] = _cell(size, precision, gpus, gb, config)
        elif config.get("simulated_ranks", True) and config["table_gpus"] > 0:
            cells[f"{size}-{precision}-{gpus}x{gb}g-simulated"] = _cell(
                size, precision, gpus, gb, config, simulated=True
            )
    whole = config.get("whole_gpu", {"sizes": [], "precisions": []})
    check_whole_gpu(whole)
    for size in whole["sizes"]:
        for precision in whole["precisions"]:
            cells[f"{size}-{precision}-whole"] = _cell(size, precision, 1, None, config)
            for variant in whole.get("variants", {}):
                cells[f"{size}-{precision}-whole-{variant}"] = _cell(
                    size, precision, 1, None, config, variant
                )
    return cells


def check_whole_gpu(whole: dict[str, Any]) -> None:
    """Refuse what would fail only in a GPU job, after its model was built: fp32 on a real size, and
    a variant's override that ``easyr1 train`` refuses (a mistyped key, a value of the wrong type).
    How a variant's values fit the workload's (batch sizes) the bench checks, on the workload's
    config, which needs torch to build."""
    if "fp32" in whole["precisions"] and any(size != "tiny" for size in whole["sizes"]):
        raise ConfigError(
            "whole_gpu.precisions: fp32 is for the tiny size only (the sized models run bf16, amp or lora)"
        )
    for name, overrides in whole.get("variants", {}).items():
        try:
            load_config(list(overrides))
        except ConfigError as exc:
            raise ConfigError(f"whole_gpu.variants.{name}: {exc}") from None
