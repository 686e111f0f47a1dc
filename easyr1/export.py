"""Export of a checkpoint's component (``global_step_N/actor``) to Hugging Face format: a folder that
``from_pretrained`` loads (full weights, a LoRA actor merged into its base) or a peft adapter, written
atomically and optionally loaded back and checked. ``easyr1 merge`` runs it.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from easyr1.checkpoint import (
    ADAPTER_CONFIG,
    EASYR1_SHARDS,
    HF_DIR,
    MODEL_FILES,
    CheckpointError,
    component_problem,
    copy_model_files,
    free_bytes,
    no_space,
    size_text,
)
from easyr1.files import is_weight_file, share_weight_files
from easyr1.safe_dcp import SafeReader, WeightsOnlyPlanner


def _load_model_state(component: Path) -> dict[str, torch.Tensor]:
    """The full model tensors of a DCP folder, read in this one process (no process group)."""
    reader = SafeReader(component)  # no code runs from .metadata or a shard
    metadata = reader.read_metadata()
    model = {
        key[len("model.") :]: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load({"model": model}, storage_reader=reader, planner=WeightsOnlyPlanner(), no_dist=True)
    return model


def _model_class(hf_dir: Path) -> type:
    """The model class that config.json names (an Auto class where it names none transformers has)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from easyr1.models.loading import is_vision_model

    names = getattr(AutoConfig.from_pretrained(hf_dir), "architectures", None) or []
    model_class = getattr(transformers, names[0], None) if names else None
    if model_class is None:
        model_class = AutoModelForImageTextToText if is_vision_model(hf_dir) else AutoModelForCausalLM
    return model_class


def _empty_model(hf_dir: Path) -> nn.Module:
    """The model class that config.json names, built on the meta device, so that merging allocates
    nothing but the loaded tensors."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(hf_dir)
    model_class = _model_class(hf_dir)
    with torch.device("meta"):
        is_auto = model_class.__name__.startswith("Auto")
        return model_class.from_config(config) if is_auto else model_class(config)


def verify_merged(out: Path, expected: dict[str, torch.Tensor]) -> None:
    """Load ``out`` as its user will (``from_pretrained``) and check that every tensor of
    ``expected`` (the merged model's state) came back bit-exact. A folder that saves but does not load back as trained (a missing
    file, a renamed or dropped key, a cast) fails here rather than in the user's job."""
    reloaded = _model_class(out).from_pretrained(
        out, dtype=next(v.dtype for v in expected.values() if v.is_floating_point())
    )
    got = reloaded.state_dict()
    if set(got) != set(expected):
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        raise CheckpointError(f"{out}: reloaded keys differ (missing {missing[:5]}, unexpected {extra[:5]})")
    changed = [k for k in expected if not torch.equal(got[k], expected[k])]
    if changed:
        raise CheckpointError(
            f"{out}: {len(changed)} tensors reload with other values than were saved, e.g. {changed[:5]}"
        )


def merge_checkpoint(
    local_dir: str | Path,
    output: str | Path | None = None,
    *,
    lora_adapter: bool = False,
    dtype: torch.dtype | None = None,
    verify: bool = False,
) -> Path:
    """Turn ``global_step_N/actor`` into a folder that ``from_pretrained`` loads; returns it.

    Default output: ``local_dir/huggingface`` (full weights; a LoRA actor is merged into its base).
    ``lora_adapter``: save the LoRA weights as a peft adapter instead (default ``local_dir/lora_adapter``).
    ``dtype``: cast the weights (default: as trained, e.g. fp32 master weights under AMP).
    ``verify``: then load the folder back with ``from_pretrained`` and check it (``verify_merged``).
    """
    local_dir = Path(local_dir)
    hf_dir = local_dir / HF_DIR
    if not local_dir.is_dir():
        raise CheckpointError(f"{local_dir}: no such folder (pass .../global_step_N/actor)")
    if next(local_dir.glob(EASYR1_SHARDS), None) is not None:
        raise CheckpointError(
            f"{local_dir} is a checkpoint of EasyR1 itself (model_world_size_*_rank_*.pt, FSDP1's per-rank "
            "files), which this engine neither writes nor reads: merge it with EasyR1's scripts/model_merger.py"
        )
    if not (local_dir / ".metadata").is_file() or not (hf_dir / "config.json").is_file():
        raise CheckpointError(
            f"{local_dir} is not a component of a checkpoint (expected .metadata and {HF_DIR}/config.json; "
            "pass .../global_step_N/actor)"
        )
    problem = component_problem(local_dir)
    if problem is not None:
        raise CheckpointError(f"{local_dir}: {problem}; nothing merged")
    state = _load_model_state(local_dir)
    is_lora = any(".lora_A." in key for key in state)
    if lora_adapter and verify:
        raise CheckpointError("verify checks a merged model folder, not a LoRA adapter")
    if lora_adapter and not is_lora:
        raise CheckpointError(f"{local_dir} holds no LoRA weights; merge it without --lora-adapter")
    if is_lora and not (local_dir / ADAPTER_CONFIG).is_file():
        raise CheckpointError(f"{local_dir} holds LoRA weights but no {ADAPTER_CONFIG}")
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    out = Path(output) if output is not None else local_dir / ("lora_adapter" if lora_adapter else HF_DIR)

    model = _empty_model(hf_dir)
    if is_lora:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig.from_pretrained(str(local_dir))
        model.name_or_path = lora.base_model_name_or_path  # the adapter keeps naming the run's base model
        with torch.device("meta"):
            model = get_peft_model(model, lora)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    stored = next(v.dtype for v in state.values() if v.is_floating_point())
    if not lora_adapter:
        if is_lora:
            model = model.merge_and_unload()
        model.config.dtype = stored
        if (hf_dir / "generation_config.json").is_file():
            from transformers import GenerationConfig

            model.generation_config = GenerationConfig.from_pretrained(hf_dir)
    weights = {k: v for k, v in state.items() if not lora_adapter or ".lora_" in k}
    with _written_atomically(out, sum(v.numel() * v.element_size() for v in weights.values())) as staging:
        model.save_pretrained(str(staging))  # a LoRA actor under lora_adapter: the peft adapter
        if out.resolve() != hf_dir.resolve():  # tokenizer and processor beside the weights (or the adapter)
            copy_model_files(hf_dir, staging, skip=MODEL_FILES)
    if verify:
        verify_merged(out, model.state_dict())
    return out


def _write_error(exc: Exception) -> str:
    """The OS's reason in a few words (``No space left on device``), not the path of a staging file."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    # safetensors: 'Error while serializing: I/O error: No space left on device (os error 28) at path "..."'
    found = re.search(r"I/O error: (.+?) \(os error \d+\)", str(exc))
    return found.group(1) if found else str(exc)


@contextmanager
def _written_atomically(out: Path, needed: int) -> Iterator[Path]:
    """A staging folder beside ``out`` to write a model into; on success its files become ``out``'s,
    on any failure it is removed and ``out`` is as it was, so that no folder that looks like a model
    but lacks its weights is left (an OSError or SafetensorError becomes a CheckpointError). A new
    ``out`` is renamed into place whole; an existing one (the checkpoint's own ``huggingface/``,
    whose config and tokenizer files merge reads) receives each file by rename, the weights last.
    A full disk is said as such, with ``needed`` (the bytes of the weights) and the room there was."""
    from safetensors import SafetensorError

    staging = out.absolute().with_name(f".{out.absolute().name}.merging")  # out may be "."
    free = free_bytes(staging)
    try:
        shutil.rmtree(staging, ignore_errors=True)  # left by a merge that was killed
        staging.mkdir(parents=True)
        yield staging
        share_weight_files(staging)
        if not out.exists():
            os.rename(staging, out)
            return
        for file in sorted(staging.iterdir(), key=lambda f: is_weight_file(f.name)):
            os.replace(file, out / file.name)
    except (OSError, SafetensorError) as exc:
        if no_space(exc, staging, needed):
            raise CheckpointError(
                f"cannot write {out}: no space left on {out}: the merged model needs about {size_text(needed)}, "
                f"and {size_text(free)} were free when the merge started; nothing merged"
            ) from None
        raise CheckpointError(f"cannot write {out}: {_write_error(exc)}; nothing merged") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
