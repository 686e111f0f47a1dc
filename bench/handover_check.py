"""GPU check of the vLLM weight hand-over: fp32 actor and fp32 vLLM, weights changing every step.

A tiny random Qwen2 trained with a large learning rate and an entropy bonus (so its weights move
even when every reward is 0); if the hand-over works, the rollout's log-probs match the actor's
to float32 precision at every step, and a stale vLLM copy would show a growing difference.
Usage: python bench/handover_check.py OUT_DIR  (prints and writes OUT_DIR/handover_check.json)
"""

import json
import sys
from pathlib import Path

from easyr1.config import load_config
from easyr1.data.synthetic import write_task
from easyr1.launch.local import launch
from easyr1.models.tiny import build_tiny_model

root = Path(sys.argv[1])
model = build_tiny_model("qwen2", root / "model", seed=0)
write_task("arithmetic", root / "data", n_train=64, n_test=8)
fp32 = {"torch_dtype": "fp32", "mp_param_dtype": "fp32"}
args = [
    f"data.train_files={root / 'data'}@train",
    "data.val_files=",
    "data.max_response_length=32",
    "data.prompt_key=problem",
    "data.rollout_batch_size=8",
    "data.min_pixels=null",
    "data.max_pixels=null",
    f"worker.actor.model.model_path={model}",
    "worker.actor.global_batch_size=8",
    "worker.actor.micro_batch_size_per_device_for_update=8",
    "worker.actor.optim.lr=1.0e-2",
    "worker.actor.optim.lr_warmup_steps=0",
    "worker.actor.entropy_coeff=0.1",
    "worker.actor.fsdp.torch_dtype=fp32",
    "worker.actor.fsdp.mp_param_dtype=fp32",
    "worker.ref.fsdp.torch_dtype=fp32",
    "worker.rollout.name=vllm",
    "worker.rollout.tensor_parallel_size=1",
    "worker.rollout.dtype=fp32",
    "worker.rollout.n=4",
    "worker.rollout.gpu_memory_utilization=0.2",
    "worker.rollout.enforce_eager=true",
    "worker.rollout.calculate_log_probs=true",
    "worker.reward.reward_function=math",
    "trainer.n_gpus_per_node=1",
    "trainer.max_steps=5",
    "trainer.logger=[file]",
    "trainer.val_before_train=false",
    f"trainer.save_checkpoint_path={root / 'run'}",
]
code = launch(load_config(args), args)
keys = (
    "rollout/logp_diff_mean",
    "rollout/logp_diff_max",
    "rollout/handover_s",
    "actor/grad_norm",
    "actor/entropy",
)
rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
result = [{"step": r["step"], **{k: r.get(k) for k in keys}} for r in rows]
(root / "handover_check.json").write_text(json.dumps(result, indent=2))
print(json.dumps(result, indent=2))
sys.exit(code)
