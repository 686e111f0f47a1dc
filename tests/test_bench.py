"""`easyr1 bench` end to end on CPU: the smoke workload's JSON, with overrides applied and recorded,
kept when the peer run after it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_smoke_benchmark_writes_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    peer = tmp_path / "broken_peer.py"  # a TRL peer that fails after our run (as a missing file did on the H200)
    peer.write_text("raise SystemExit(2)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, "-m", "easyr1.cli", "bench", "--workload", "smoke", "--steps", "2", "--root", str(tmp_path),
         "--out", str(out), "--trl", str(peer), "worker.actor.micro_batch_size_per_device_for_update=2"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode != 0 and "broken_peer.py" in done.stderr, done.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["workload"] == "smoke" and summary["backend"] == "hf" and summary["steps"] == 2
    assert summary["rollouts_per_step"] == 8 and summary["step_s"] > 0 and summary["tokens_per_s"] > 0
    assert summary["overrides"] == ["worker.actor.micro_batch_size_per_device_for_update=2"]
    resolved = (tmp_path / "smoke" / "run" / "config.yaml").read_text()
    assert "micro_batch_size_per_device_for_update: 2" in resolved
    assert summary["phases"]["timing_s/update_actor"] > 0
    assert "timing_s/old_log_prob" not in summary["phases"]  # one mini-batch, one epoch: on-policy
    assert len(summary["per_step"]) == 2 and summary["git_revision"]
    assert "speedup_vs_trl" not in summary
