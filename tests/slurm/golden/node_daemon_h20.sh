#!/bin/bash
# weave-slurm: the node-daemon step of group 7, pool h20.
# Rendered by weave_slurm.slurm.templates; run as one task per node with
#   srun --jobid=<alloc> --overlap --exact -N <nodes> --ntasks-per-node=1 -c 1 <this file>
# The socket path matches what the weave SPANK plugin gives tasks (WEAVE_NODE_SOCKET).
set -euo pipefail

export WEAVE_GROUP=7
export WEAVE_POOL=h20
export WEAVE_SHM_BUDGET_GIB=64
sock_dir='/run/weave dir'
mkdir -p "$sock_dir"
export WEAVE_NODE_SOCKET="$sock_dir/node-${SLURMD_NODENAME:?not inside a Slurm step}.sock"

exec python -m weave_slurm.node --serve
