"""``easyr1 memory``: the estimate of ``easyr1/memory.py`` for a config, printed as a table of terms
per phase (or JSON), with the verdict and the smallest GPU count that fits. ``--measure`` is
``memory_measure.py``'s."""

from __future__ import annotations

import argparse
import json
import sys

from easyr1 import memory
from easyr1.config import load_config
from easyr1.memory import CONTEXT_GIB, GIB, Estimate, estimate, smallest_fit
from easyr1.models.architecture import Architecture


def render(result: Estimate, gpu_memory_gib: float | None) -> str:
    """The phases as a table of terms in GiB, the peak and the verdict."""
    lines = [f"Predicted GPU memory per device on {result.gpus} GPU(s), GiB (allocated by PyTorch):", ""]
    for phase, terms in result.phases.items():
        mark = "  <- peak" if phase == result.peak_phase else ""
        lines.append(f"{phase}: {result.phase_total(phase) / GIB:.2f}{mark}")
        lines += [f"    {name:<52} {value / GIB:8.2f}" for name, value in terms.items() if value]
    lines += [
        "",
        f"CUDA context and NCCL: {result.context / GIB:.2f}",
        f"device peak: {result.device / GIB:.2f} GiB",
    ]
    if gpu_memory_gib is not None:
        lines.append(
            f"on {gpu_memory_gib:g} GiB GPUs: {'fits' if result.fits(gpu_memory_gib) else 'does not fit'}"
        )
    lines += [f"blocker: {b}" for b in result.blockers] + [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """``easyr1 memory``'s flags; the arguments it leaves configure the run, as for ``easyr1 train``."""
    parser = argparse.ArgumentParser(
        prog="easyr1 memory",
        description=memory.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The remaining arguments configure the run as for `easyr1 train`: config=FILE.yaml key=value ...",
    )
    parser.add_argument(
        "--model", help="model folder or named size (qwen2:7b); default worker.actor.model.model_path"
    )
    parser.add_argument("--gpus", type=int, help="devices; default trainer.nnodes x trainer.n_gpus_per_node")
    parser.add_argument(
        "--gpu-memory",
        type=float,
        metavar="GIB",
        help="each GPU's memory: the verdict, and the smallest count that fits",
    )
    parser.add_argument(
        "--context",
        type=float,
        default=CONTEXT_GIB,
        metavar="GIB",
        help="CUDA context per device (NCCL's buffers are added with more than one)",
    )
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    parser.add_argument(
        "--measure",
        action="store_true",
        help="also run rank 0 of the job on this GPU for two steps (simulated ranks) and print the measured peak per "
        "phase beside the prediction, with the verdict (easyr1/memory_measure.py; --gpus, --gpu-memory as here)",
    )
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    ns, rest = parser.parse_known_args(argv)
    config = load_config(rest)
    arch = Architecture.load(ns.model or config.worker.actor.model.model_path)
    gpus = ns.gpus or config.trainer.nnodes * config.trainer.n_gpus_per_node
    try:
        result = estimate(config, arch, gpus=gpus, gpu_memory_gib=ns.gpu_memory, context_gib=ns.context)
    except ValueError as exc:  # a run the arithmetic cannot size as asked: say why, no traceback
        parser.error(str(exc))
    fit = smallest_fit(config, arch, ns.gpu_memory, context_gib=ns.context) if ns.gpu_memory else None
    if ns.json:
        out = {
            "model": ns.model or config.worker.actor.model.model_path,
            "params": arch.params,
            **result.to_dict(),
        }
        if ns.gpu_memory:
            out.update(
                gpu_memory_gib=ns.gpu_memory,
                fits=result.fits(ns.gpu_memory),
                smallest_fit=fit.gpus if fit else None,
            )
        print(json.dumps(out, indent=2))
        return 0
    print(f"{ns.model or config.worker.actor.model.model_path}: {arch.params / 1e9:.2f} B parameters")
    print(render(result, ns.gpu_memory))
    if ns.gpu_memory:
        print(
            f"smallest count of {ns.gpu_memory:g} GiB GPUs that fits: {fit.gpus if fit else 'none up to 1024'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
