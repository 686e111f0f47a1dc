"""GPU check of the vision tower's attention: transformers' loop of one SDPA call per image window
against ``VISION`` (one varlen call per block, ``easyr1/models/attention.py``).

The Qwen2.5-VL-3B tower (32 blocks, width 1280; random init, bf16) on the VL anchor's images: 64 of
448x448, 1,024 patches each, 16 attention windows each in 28 of the blocks. For each attention, the
forward pass and the forward + backward pass (gradient checkpointing on, as the actor trains) are
timed (median of 3 after a warm-up round, alternating the two); then, on 8 of the images without gradients, each attention's bf16 output against the fp32
output of transformers' loop (the reference both approximate).
Usage: python bench/vision_attention.py OUT.json
"""

import json
import statistics
import sys
import time

import torch
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

from easyr1.models.attention import VISION
from easyr1.models.tiny import SIZES
from easyr1.provenance import describe

IMAGES, SIDE, REPEATS = 64, 448, 3


def timed(tower: torch.nn.Module, pixels: torch.Tensor, grid: torch.Tensor, backward: bool) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        out = tower(pixels, grid_thw=grid)
        out = out if isinstance(out, torch.Tensor) else out.pooler_output  # the merged image features
        if backward:
            out.float().square().mean().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def accuracy(tower: torch.nn.Module, pixels: torch.Tensor, grid: torch.Tensor) -> dict[str, float]:
    """Each attention's bf16 output against the loop's fp32 output: max and mean absolute error."""
    config = tower.config

    def output(dtype: torch.dtype, attention: str) -> torch.Tensor:
        config._attn_implementation = attention
        with torch.no_grad():
            out = tower.to(dtype)(pixels.to(dtype), grid_thw=grid)
        return (out if isinstance(out, torch.Tensor) else out.pooler_output).float()

    reference = output(torch.float32, "sdpa")
    result = {"reference_abs_mean": reference.abs().mean().item()}
    for attention in ("sdpa", VISION):
        error = (output(torch.bfloat16, attention) - reference).abs()
        result[f"{attention}/bf16_max_abs_error"] = error.max().item()
        result[f"{attention}/bf16_mean_abs_error"] = error.mean().item()
    return result


def main() -> None:
    config = Qwen2_5_VLVisionConfig(**SIZES[("qwen2_5_vl", "3b")]["vision"])
    torch.manual_seed(0)
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(config, attn_implementation="sdpa")
    tower = tower.to("cuda", torch.bfloat16)
    tower.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False}
    )  # as the actor trains
    patches = SIDE // config.patch_size
    grid = torch.tensor([[1, patches, patches]] * IMAGES, device="cuda")
    features = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = torch.randn(IMAGES * patches * patches, features, device="cuda", dtype=torch.bfloat16)
    times: dict[str, list[float]] = {}
    for attention in ("sdpa", VISION, "sdpa", VISION):  # the first round warms up
        config._attn_implementation = attention
        for backward in (False, True):
            times[f"{attention}/{'forward+backward' if backward else 'forward'}"] = [
                timed(tower, pixels, grid, backward) for _ in range(REPEATS)
            ]
    results = {
        key: {
            "median_s": round(statistics.median(v), 4),
            "min_s": round(min(v), 4),
            "max_s": round(max(v), 4),
        }
        for key, v in times.items()
    }
    for kind in ("forward", "forward+backward"):
        results[f"speedup/{kind}"] = round(
            results[f"sdpa/{kind}"]["median_s"] / results[f"{VISION}/{kind}"]["median_s"], 2
        )
    results["accuracy"] = accuracy(tower, pixels[: 8 * patches * patches].float(), grid[:8])
    record = {
        "check": "vision_attention",
        "gpu": torch.cuda.get_device_name(),
        "images": IMAGES,
        "side": SIDE,
        **describe(),
        "results": results,
    }
    print(json.dumps(results, indent=1))
    with open(sys.argv[1], "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
