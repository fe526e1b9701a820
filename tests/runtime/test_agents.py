"""Starting a layout's sync agents: real processes on their control pipes, each
standing in for an agent that says where to meet, joins, or dies before joining."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weave_slurm.runtime.agents import AgentGroup
from weave_slurm.runtime.group import GroupLayout, NodeRef
from weave_slurm.slurm.backend import StepSpec
from weave_slurm.slurm.command_runner import PipedProcess
from weave_slurm.sync.sync_errors import AgentDidNotStart
from weave_slurm.vocab import Pool

#: What each stand-in agent does, by node: "rendezvous" says where to meet and then
#: waits for a peer that never joins (a real rank 0 waits in init_process_group);
#: "ready" says where (rank 0) and then READY; "dies" exits at once, as an srun to a
#: node Slurm has failed does.
SCRIPTS = {
    "rendezvous": "print('RENDEZVOUS tcp://127.0.0.1:1', flush=True); import time; "
                  "time.sleep(60)",
    "ready": "import json, os, sys\n"
             "if sys.argv[1] == '0': print('RENDEZVOUS tcp://127.0.0.1:1', flush=True)\n"
             "print('READY', os.getpid(), flush=True)\n"
             "for line in sys.stdin:\n"
             "    if json.loads(line)['op'] == 'stop': break\n"
             "    print(json.dumps({'ok': True}), flush=True)\n",
    "dies": "import sys; sys.exit(3)",
}


def _layout(tmp_path: Path) -> GroupLayout:
    return GroupLayout(rollout=(NodeRef("r0", Pool.ROLLOUT, tmp_path / "r0.sock"),),
                       train=(NodeRef("t0", Pool.TRAIN, tmp_path / "t0.sock"),))


def _group(tmp_path: Path, roles: dict[str, str], start_timeout_s: float) -> AgentGroup:
    def launch(node: NodeRef, spec: StepSpec) -> PipedProcess:
        assert spec.log_path is not None
        rank = "0" if node.pool is Pool.TRAIN else "1"
        with spec.log_path.open("ab") as err:
            return subprocess.Popen([sys.executable, "-c", SCRIPTS[roles[node.name]], rank],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err)
    return AgentGroup(_layout(tmp_path), timeout_s=5, start_timeout_s=start_timeout_s,
                      mode="full", launcher=launch)


def test_an_agent_that_dies_fails_the_start_at_once_naming_its_node(tmp_path: Path) -> None:
    group = _group(tmp_path, {"t0": "rendezvous", "r0": "dies"}, start_timeout_s=60)
    began = time.monotonic()
    try:
        # typed as the node's fault: Slurm did not start it there (issue 33, C1)
        with pytest.raises(AgentDidNotStart, match=r"sync agent on r0 \(pid \d+, exit 3\) "
                                                   "exited before it could join the group"):
            group.start()
        assert time.monotonic() - began < 30   # not the 60 s rank 0 would have waited
    finally:
        group.stop(grace_s=0.5)


def test_agents_that_join_are_up_with_their_own_pids(tmp_path: Path) -> None:
    group = _group(tmp_path, {"t0": "ready", "r0": "ready"}, start_timeout_s=30)
    try:
        group.start()
        pids = group.pids()
        assert len(pids) == 2 and all(pid > 0 for pid in pids)
        assert sorted(group.nodes()) == [(Pool.ROLLOUT, "r0"), (Pool.TRAIN, "t0")]
    finally:
        group.stop(grace_s=0.5)


def test_two_shares_of_one_host_get_an_agent_each_stepped_onto_the_host(
        tmp_path: Path) -> None:
    """Two GPU shares of one host are two nodes of the layout: an agent each, keyed by
    its share's name, each a step on the host Slurm knows (``nodelist``), talking to its
    own share's node daemon."""
    shares = tuple(NodeRef(f"h20-0.{job}", Pool.ROLLOUT, tmp_path / f"node-h20-0.{job}.sock",
                           host="h20-0") for job in (501, 502))
    layout = GroupLayout(rollout=shares, train=(NodeRef("t0", Pool.TRAIN, tmp_path / "t.sock"),))
    steps: dict[str, StepSpec] = {}

    def launch(node: NodeRef, spec: StepSpec) -> PipedProcess:
        assert spec.log_path is not None
        steps[node.name] = spec
        rank = "0" if node.pool is Pool.TRAIN else "1"
        with spec.log_path.open("ab") as err:
            return subprocess.Popen([sys.executable, "-c", SCRIPTS["ready"], rank],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    group = AgentGroup(layout, timeout_s=5, start_timeout_s=30, mode="full", launcher=launch)
    try:
        group.start()
        assert sorted(group.nodes()) == [(Pool.ROLLOUT, "h20-0.501"),
                                         (Pool.ROLLOUT, "h20-0.502"), (Pool.TRAIN, "t0")]
        assert [steps[k].nodelist for k in ("h20-0.501", "h20-0.502", "t0")] == \
            [("h20-0",), ("h20-0",), ("t0",)]
        said = {k: json.loads(s.argv[-1]) for k, s in steps.items()}
        assert [said[k]["node_socket"] for k in ("h20-0.501", "h20-0.502")] == \
            [str(n.socket_path) for n in shares]
        assert said["t0"]["world"] == [["train", "t0"], ["rollout", "h20-0.501"],
                                       ["rollout", "h20-0.502"]]
    finally:
        group.stop(grace_s=0.5)
