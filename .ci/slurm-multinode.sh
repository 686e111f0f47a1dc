#!/usr/bin/env bash
# Several machines for real, on one: the two-node SLURM cluster of .ci/slurm-cluster.sh (needs
# root), then tests/harness/test_slurm_multinode.py on it: ranks on two nodes through srun, equal to the
# same run on one node, and a node's rank killed mid-run.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/slurm-cluster.sh
trap cluster_stop EXIT
cluster_start
EASYR1_SLURM_NODES=n1,n2 HF_HUB_OFFLINE=1 .venv/bin/pytest -q -p no:cacheprovider tests/harness/test_slurm_multinode.py
