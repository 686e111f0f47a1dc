"""Benchmarks on named workloads: build the model and data, train a few steps, write JSON.

The anchor workload, ``anchor``, is one GRPO step of a random-init model with the Qwen2.5-1.5B
architecture (hidden 1536, intermediate 8960, 28 layers, 12 attention and 2 KV heads, vocabulary
151936, tied embeddings) on one GPU, in bf16 with gradient checkpointing: 8 prompts x 8 samples =
64 rollouts, every prompt exactly 256 tokens after the chat template, every response exactly 512
tokens (EOS is ignored: a random model's answers would otherwise stop at random), KL to the
reference model as a loss (low_var_kl, coefficient 0.01), one update of the whole batch. That
is 64 x 768 = 49,152 tokens per step. ``anchor_vl`` is the same step on a random-init
Qwen2.5-VL-3B architecture with prompts of up to 512 tokens, each carrying one 448x448 image. ``smoke`` and
``smoke_vl`` are the same shapes on tiny models, to check the benchmark itself on a CPU.

Step time is the wall time of a whole step (generation, rewards, log-probs, update); the first
step pays for warm-up (compilation, CUDA graphs, allocator), so the summary's figures are the
median, minimum and maximum over steps 2..N, and every step's figures are kept too.

``--trl`` runs TRL's GRPOTrainer on the same model folder and prompts (images included, on
``smoke_vl`` and ``anchor_vl``) afterwards, in the same invocation (``bench/trl_peer.py``), and
reports its step times by the same rule;
``speedup_vs_trl`` is TRL's median step time over ours. Two runs on one machine, one after the
other, is what makes the ratio meaningful: the host's speed varies between invocations.
``--trl-vllm`` runs the same peer generating with vLLM colocated (TRL's ``vllm_mode="colocate"``)
on our engine's vLLM settings: its share of the GPU, sleep mode, compilation settings and vLLM's
environment (``easyr1.rollout.vllm.set_vllm_env``). Both flags together run both peers after our
run, each beside the same figures of ours: a record per peer. The peer's side is ``bench_peer.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from easyr1.bench_peer import peer_refusal, run_peers, step_stats
from easyr1.config import override_value
from easyr1.data.synthetic import write_task
from easyr1.distributed.simulated import SIMULATED_RANKS_ENV
from easyr1.models.loading import load_tokenizer
from easyr1.models.tiny import build_tiny_model
from easyr1.provenance import cpu_model, fingerprint, git_revision, numa_nodes, pci_numa_node
from easyr1.telemetry import GPU_MEMORY_ENV, gpu_bus_id
from easyr1.workloads import PRECISIONS, WORKLOADS, default_precision, workload_config

FILLER = "Solve the problem step by step and put the final answer within a box. "


def _text_prompts(
    tokenizer: Any, count: int, length: int, shortest: int | None = None
) -> list[dict[str, str]]:
    """Problems whose chat-templated prompt is exactly ``length`` tokens (``shortest``: the i-th of
    every ``count`` spread evenly from ``shortest`` to ``length``)."""

    def templated(text: str) -> int:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])

    rows = []
    filler_ids = tokenizer(FILLER * (length // 4 + 1), add_special_tokens=False)["input_ids"]
    for i in range(count):
        head = f"What is {i + 2} + {i + 3}? "
        want = length if shortest is None else shortest + (length - shortest) * i // max(1, count - 1)
        # Decoding then re-encoding can merge tokens at the seam, so step towards the length and
        # keep the longest text that does not exceed it.
        take, best = max(0, want - templated(head)), head
        for _ in range(64):
            text = head + tokenizer.decode(filler_ids[:take])
            have = templated(text)
            if have <= want:
                best = text
            if have == want or take == 0:
                break
            take += 1 if have < want else -1
        rows.append({"problem": best, "answer": str(2 * i + 5)})
    return rows


def prepare(
    name: str,
    root: Path,
    device: str,
    backend: str = "hf",
    gpus: int = 1,
    precision: str | None = None,
    model: Path | None = None,
    weights: bool = True,
) -> dict[str, Any]:
    """Model folder (``model``, else one built in ``root``; ``weights=False``: one without weight
    files, for simulated ranks), data files and the training config (as override arguments) for ``name``."""
    work = WORKLOADS[name]
    root.mkdir(parents=True, exist_ok=True)
    if model is not None and not (model / "config.json").is_file():
        raise FileNotFoundError(
            f"--model {model}: no config.json there (easyr1 tiny-model --arch {work.arch} --size {work.size} builds one)"
        )
    if model is None:
        model = root / ("model" if weights else "model-config")
        if not (model / ".complete").exists():  # a run with the same root reuses it (a 7B folder is 15 GB)
            # In a child process: a CUDA context (and cached blocks) left in this one would sit on the
            # GPU beside the ranks, and under a simulated smaller GPU (``--gpu-memory``) count against it.
            build = multiprocessing.get_context("spawn").Process(
                target=build_tiny_model,
                args=(work.arch, model),
                kwargs=dict(seed=0, size=work.size, device=device, weights=weights),
            )
            build.start()
            build.join()
            if build.exitcode:
                raise RuntimeError(
                    f"building the {work.arch} {work.size} model in {model} failed (exit code {build.exitcode})"
                )
            (model / ".complete").touch()
    prompts = work.prompts_on(gpus)
    if work.image_size:
        splits = write_task(
            work.task, root / "data", n_train=prompts * 4, n_test=4, seed=0, image_size=work.image_size
        )
        train = str(splits["train"])
    else:
        rows = _text_prompts(load_tokenizer(model), prompts * 4, work.prompt_tokens, work.min_prompt_tokens)
        train = str(root / "train.jsonl")
        Path(train).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        **workload_config(name, backend, gpus, precision),
        "data.train_files": train,
        "worker.actor.model.model_path": str(model),
        "trainer.save_checkpoint_path": str(root / "run"),
    }


def vllm_engine_kwargs(
    name: str, model: str, overrides: list[str] | tuple[str, ...] = (), *, gpu_memory_gib: float
) -> dict[str, Any]:
    """The arguments our vLLM rollout gives ``vllm.LLM`` on one GPU of ``gpu_memory_gib`` in workload
    ``name``'s run (``KEY=VALUE`` ``overrides`` on top, as ``easyr1 bench`` takes them), with ``model``
    as the model folder: what the TRL vLLM peer copies its engine's settings from, sleep mode
    included (``free_cache_engine=auto`` decided as our run decides it). Needs no vLLM."""
    from easyr1.config import load_config
    from easyr1.rollout.backend import settle_free_cache_engine, vllm_model_settings
    from easyr1.rollout.vllm import engine_kwargs

    settings = {**workload_config(name, "vllm"), "worker.actor.model.model_path": model}
    config = load_config([f"{k}={override_value(v)}" for k, v in settings.items()] + list(overrides))
    rollout, _ = settle_free_cache_engine(config, 1, gpu_memory_gib)
    return engine_kwargs(rollout, **vllm_model_settings(config))


def _gpu_numa_node() -> int | None:
    """The NUMA node the first GPU hangs off, where NVML and sysfs say."""
    bus_id = gpu_bus_id(torch.device("cuda", 0)) if torch.cuda.is_available() else None
    return pci_numa_node(bus_id) if bus_id else None


def provenance() -> dict[str, Any]:
    import importlib.metadata

    import transformers

    try:
        vllm = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        vllm = None
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_total_gib": torch.cuda.get_device_properties(0).total_memory / 2**30
        if torch.cuda.is_available()
        else None,
        "cpu": cpu_model(),
        "cpus": len(os.sched_getaffinity(0)),
        "numa_nodes": numa_nodes(),
        "gpu_numa_node": _gpu_numa_node(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vllm": vllm,
        "python": platform.python_version(),
        "git_revision": git_revision(),
        "engine": fingerprint(),  # the engine's source hash: the baselines page flags records of an older engine
        "vllm_env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")},
        # The caching allocator's settings (expandable segments, ...) change what memory is held.
        "allocator_env": {
            k: v for k, v in os.environ.items() if k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
        },
    }


def memory_summary(steps: list[dict[str, Any]], run_dir: Path, cap_gib: float | None) -> dict[str, Any]:
    """Peak memory per phase over every step (the first included: memory has no warm-up to leave
    out), and whether the run fitted: every step ran, and under a cap, PyTorch's allocated peak plus
    what lies outside its allocator (the CUDA context, NCCL) stayed within it. (Its cache above the
    allocated peak is given back before an allocation fails, so it does not decide.)"""
    peaks: dict[str, dict[str, float]] = {}
    for s in steps:
        for key, value in s.items():
            if key.startswith("perf/max_memory_") and key.count("/") == 2:
                kind, phase = (
                    key.split("/")[1].removeprefix("max_memory_").removesuffix("_gb"),
                    key.split("/")[2],
                )
                peaks.setdefault(phase, {})[kind] = max(peaks.get(phase, {}).get(kind, 0.0), value)
    other = max((s.get("perf/gpu_other_memory_gb", 0.0) for s in steps), default=0.0)
    reserved = max((p.get("reserved", 0.0) for p in peaks.values()), default=0.0)
    allocated = max((p.get("allocated", 0.0) for p in peaks.values()), default=0.0)
    ooms = [json.loads(p.read_text()) for p in sorted(run_dir.glob("oom-rank*.json"))]
    needed = allocated + other if steps else None
    return {
        "gpu_memory_gib": cap_gib,
        "fits": not ooms and bool(steps) and (cap_gib is None or needed <= cap_gib),
        "oom": ooms[0] if ooms else None,
        "peak_needed_gib": needed,  # allocated + outside the allocator: what the GPU must have
        "peak_held_gib": reserved + other if steps else None,  # with PyTorch's cache: what it held
        "gpu_other_memory_gib": other if steps else None,
        "memory_phases": peaks,
    }


# The per-step figures a summary keeps besides phases and rollout figures: time, collector pauses,
# and the actor's losses, entropy and gradient norm, equal between two layouts of one run on step 1
# (same rollouts, same weights) up to rounding.
STEP_KEYS = (
    "step",
    "perf/time_per_step",
    "perf/throughput",
    "perf/gc_s",
    "perf/gc_full",
    "perf/cpu_process_s",
    "perf/cpu_others_s",
    "perf/cpu_steal_s",
    "perf/gpu_power_w",
    "perf/gpu_throttled_s",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
)


def summarize(
    metrics_path: Path,
    name: str,
    backend: str,
    gpus: int,
    precision: str | None = None,
    cap_gib: float | None = None,
    profiled: Sequence[int] = (),
) -> dict[str, Any]:
    """The summary of a run's ``metrics.jsonl``. Steps ``profiled`` ran under the profiler or the
    host sampler, which slow them: they are kept in ``per_step`` and counted for memory, but not in
    the times and rates."""
    every = (
        [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    )
    every = [s for s in every if s["step"] >= 1]
    steps = [s for s in every if s["step"] not in profiled]
    timed = steps[1:] or steps  # the first step pays for warm-up

    def median(key: str) -> float | None:
        values = [s[key] for s in timed if key in s]
        return statistics.median(values) if values else None

    step = step_stats([s["perf/time_per_step"] for s in steps if "perf/time_per_step" in s])
    phases = sorted(
        {k for s in steps for k in s if k.startswith(("timing_s/", "perf/max_memory", "perf/gpu_busy_s/"))}
    )
    awake = median("rollout/awake")  # vLLM kept through training (free_cache_engine decided); None: HF
    work = WORKLOADS[name]
    return {
        "workload": name,
        "backend": backend,
        "gpus": gpus,
        "dtype": "fp32" if work.size == "tiny" else "bf16",  # of the computation
        "precision": precision or default_precision(name),
        "model": f"{work.arch}-{work.size} (random init)",
        "steps": len(steps),
        "step_s": step["median"],
        "step_s_min": step["min"],
        "step_s_max": step["max"],
        "tokens_per_s": median("perf/throughput"),
        "mfu_actor": median("perf/mfu_actor"),
        # The device's real peak (torch's counter includes vLLM's pool while it sleeps); older runs: torch's.
        "peak_mem_gib": max(
            (s.get("perf/max_memory_device_gb", s.get("perf/max_memory_allocated_gb", 0.0)) for s in steps),
            default=None,
        ),
        "peak_mem_allocated_gib": max(
            (s.get("perf/max_memory_allocated_gb", 0.0) for s in steps), default=None
        ),
        "phases": {k: median(k) for k in phases},
        "vllm_awake": None if awake is None else bool(awake),
        # The actor's decoder blocks recomputed in backward (enable_gradient_checkpointing; auto decides).
        "recomputed_blocks": next(
            (s["perf/recomputed_blocks"] for s in every if "perf/recomputed_blocks" in s), None
        ),
        # ... and those that recomputed only part of their forward (``partial_recompute``), where any did.
        **{
            key: next(s[f"perf/{key}"] for s in every if f"perf/{key}" in s)
            for key in ("recomputed_attention_blocks", "recomputed_pointwise_blocks")
            if any(f"perf/{key}" in s for s in every)
        },
        # Each step's phases with the GPU's busy seconds in each, collector pauses, rollout figures
        # (hand-over time, the rollout's log-probs against the actor's) and training figures too: where
        # a slow step's time went, whether it was right, and whether two layouts of one run trained
        # alike (Ulysses or not).
        "per_step": [
            {
                k: v
                for k, v in s.items()
                if k in STEP_KEYS or k.startswith(("timing_s/", "perf/gpu_busy_s/", "rollout/"))
            }
            for s in every
        ],
        **memory_summary(every, metrics_path.parent, cap_gib),
        **provenance(),
    }


def run_shape(resolved: dict[str, Any]) -> dict[str, int]:
    """What each step held, from the run's resolved config: the workload's, or what overrides made it."""
    data, rollout = resolved["data"], resolved["worker"]["rollout"]
    return {
        "rollouts_per_step": data["rollout_batch_size"] * rollout["n"],
        "prompt_tokens": data["max_prompt_length"],
        "response_tokens": data["max_response_length"],
    }


def build_parser() -> argparse.ArgumentParser:
    """``easyr1 bench``'s arguments: the workload, its peers, and config overrides on top of it."""
    parser = argparse.ArgumentParser(
        prog="easyr1 bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="anchor")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--root", type=Path, default=Path("runs/bench"))
    parser.add_argument(
        "--model",
        type=Path,
        help="the workload's model folder, built beforehand (easyr1 tiny-model --size); default: built in ROOT",
    )
    parser.add_argument("--out", type=Path, help="summary JSON (default ROOT/WORKLOAD/summary.json)")
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="worker.rollout.name")
    parser.add_argument("--gpus", type=int, default=1, help="ranks (GPUs); the vLLM tensor-parallel size too")
    parser.add_argument(
        "--trl",
        dest="peers",
        action="append_const",
        const="hf",
        help="then run TRL's GRPOTrainer on the same workload (bench/trl_peer.py)",
    )
    parser.add_argument(
        "--trl-vllm",
        dest="peers",
        action="append_const",
        const="vllm",
        help="then run TRL's GRPOTrainer generating with vLLM colocated, on our vLLM settings (bench/trl_peer.py --mode vllm); "
        "with --trl too, both peers run, one record each",
    )
    parser.add_argument(
        "--precision",
        choices=sorted(PRECISIONS),
        help="bf16 (sized models' default), amp (the easyr1_scale workloads' default), lora; fp32 (tiny models' default)",
    )
    parser.add_argument(
        "--gpu-memory",
        type=float,
        metavar="GIB",
        help="simulate a GPU of this many GiB (a run that outgrows it counts as not fitting)",
    )
    parser.add_argument(
        "--simulated-ranks",
        type=int,
        metavar="N",
        help="run rank 0 of an N-rank job on this one GPU (or CPU) against torch's fake process group: every allocation "
        "as on one GPU of N (parameters, gradients and optimizer state sharded N ways), no communication, random "
        "weights; the Hugging Face rollout only; the summary says simulated_ranks: N",
    )
    parser.add_argument(
        "--notes", default="", help="what this run is for, kept in the summary (the report shows it)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then one more step under torch.profiler and one with the host sampler: their phases' costliest ops and "
        "Python functions go into the summary (their times do not count)",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="config overrides on top of the workload's"
    )
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    peers = list(dict.fromkeys(ns.peers or []))  # in the order asked, each once
    simulated = ns.simulated_ranks
    if simulated is not None:
        if simulated < 2:
            parser.error(f"--simulated-ranks {simulated}: simulates rank 0 of 2 or more ranks")
        if ns.gpus != 1:
            parser.error(
                f"--simulated-ranks runs rank 0 alone, on one GPU: --gpus {ns.gpus} with it is not 1"
            )
        if ns.backend != "hf" or peers:
            parser.error(
                "--simulated-ranks runs the Hugging Face rollout only (--backend hf), without the TRL peers"
            )
    for mode in peers:  # found out before our run, not after it
        refusal = peer_refusal(mode, ns.workload, ns.overrides)
        if refusal:
            parser.error(refusal)
    from easyr1.config import load_config
    from easyr1.launch.local import launch
    from easyr1.rollout.vllm import set_vllm_env

    root = ns.root / ns.workload
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # Simulated ranks: the N-rank job's config (its batch, its micro-batches per rank), rank 0 of it run here.
    world = simulated or ns.gpus
    overrides = prepare(
        ns.workload, root, device, ns.backend, world, ns.precision, ns.model, weights=simulated is None
    )
    if ns.backend == "vllm" or "vllm" in peers:
        # here, so that the record's vllm_env says what ran, and the ranks and the peer inherit it
        set_vllm_env(overrides["worker.rollout.tensor_parallel_size"])
    profiled = (ns.steps + 1, ns.steps + 2) if ns.profile else ()
    overrides["trainer.max_steps"] = ns.steps + len(profiled)
    if profiled:
        overrides["trainer.profile_steps"], overrides["trainer.host_profile_steps"] = (
            [profiled[0]],
            [profiled[1]],
        )
    run_dir = Path(overrides["trainer.save_checkpoint_path"])
    for stale in (run_dir / "metrics.jsonl", *run_dir.glob("oom-rank*.json")):
        stale.unlink(missing_ok=True)
    if ns.gpu_memory is not None:
        os.environ[GPU_MEMORY_ENV] = str(ns.gpu_memory)  # the ranks inherit it
    if simulated is not None:
        os.environ[SIMULATED_RANKS_ENV] = str(
            simulated
        )  # the launcher starts rank 0 alone, which joins the fake group
    args = [f"{k}={override_value(v)}" for k, v in overrides.items()] + ns.overrides
    code = launch(load_config(args), args)
    if code and not any(run_dir.glob("oom-rank*.json")):
        return code  # a failure other than running out of memory: nothing to record
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())  # the overrides applied
    summary = {
        **summarize(
            run_dir / "metrics.jsonl", ns.workload, ns.backend, world, ns.precision, ns.gpu_memory, profiled
        ),
        **run_shape(resolved),
        "overrides": ns.overrides,
        "notes": ns.notes,
    }
    if (
        simulated is not None
    ):  # gpus is the job's; one of them ran, rank 0 (records of real runs have no such key)
        summary["simulated_ranks"] = simulated
    if ns.backend == "vllm":  # vLLM's share of the GPU and its engines' size, as the run resolved them
        rollout = resolved["worker"]["rollout"]
        summary["vllm_gpu_memory_utilization"] = rollout["gpu_memory_utilization"]
        summary["tensor_parallel_size"] = rollout["tensor_parallel_size"]
    # ``profiled`` is empty without --profile: nothing to read then
    for key, step, suffix in zip(("profile", "host_profile"), profiled, ("", "-host"), strict=False):
        profile = run_dir / "profile" / f"step{step}-rank0{suffix}.json"
        if profile.exists():
            summary[key] = {"step": step, **json.loads(profile.read_text())}
    out = ns.out or root / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")  # kept if the peer then fails
    keys = (
        "workload",
        "backend",
        "precision",
        "simulated_ranks",
        "step_s",
        "tokens_per_s",
        "mfu_actor",
        "peak_mem_gib",
        "peak_needed_gib",
        "fits",
    )
    print(json.dumps({k: summary.get(k) for k in keys}))
    run_peers(
        peers,
        summary,
        workload=ns.workload,
        steps=ns.steps,
        model=overrides["worker.actor.model.model_path"],
        prompts=overrides["data.train_files"],
        root=root,
        out=out,
        overrides=ns.overrides,
    )
    return 0
