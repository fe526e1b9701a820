#!/bin/bash
# weave-slurm: the node-daemon step of group @@{group_id}, pool @@{pool}.
# Rendered by weave_slurm.slurm.templates; run as one task per node with
#   srun --jobid=<alloc> --overlap --exact -N <nodes> --ntasks-per-node=1 -c 1 <this file>
# The socket path matches what the weave SPANK plugin gives tasks (WEAVE_NODE_SOCKET).
set -euo pipefail

export WEAVE_GROUP=@@{group_id}
export WEAVE_POOL=@@{pool}
export WEAVE_SHM_BUDGET_GIB=@@{shm_budget_gib}
sock_dir=@@{socket_dir}
mkdir -p "$sock_dir"
export WEAVE_NODE_SOCKET="$sock_dir/node-${SLURMD_NODENAME:?not inside a Slurm step}.sock"

exec @@{node_command}
