"""weaved, its clients and the node daemon start without torch or numpy: the wire
values weaved reads (``WorkerState``, ``WorkerStatus``) live in ``node/protocol.py``, and
the node daemon works on segments' bytes (node/segment_bytes.py); the node's workers
map segments through torch. Each import runs in a fresh interpreter,
since this test process may have imported torch already."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "numpy")

PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[2:]))))
"""


def heavy_after_import(module: str) -> list[str]:
    """The heavy packages in ``sys.modules`` of a fresh interpreter after ``import module``."""
    res = subprocess.run([sys.executable, "-c", PROBE, module, *HEAVY], capture_output=True,
                         text=True, timeout=120, check=True)
    found: list[str] = json.loads(res.stdout)
    return found


@pytest.mark.parametrize("module", [
    "weave_slurm.daemon.service",      # weaved
    "weave_slurm.cli.daemon_cmd",      # weave daemon
    "weave_slurm.cli.main",            # weave
    "weave_slurm.cli.status",          # weave status
    "weave_slurm.cli.sbatch",          # weave-sbatch
    "weave_slurm.node.protocol",       # the wire values themselves
    "weave_slurm.node.daemon",         # weave node serve (node/segment_bytes.py)
])
def test_weaved_and_its_clients_import_no_torch_or_numpy(module: str) -> None:
    assert heavy_after_import(module) == []


def test_the_probe_sees_torch_where_the_node_side_imports_it() -> None:
    """A resident worker's loop does need torch: so the probe above can fail."""
    pytest.importorskip("torch")
    assert "torch" in heavy_after_import("weave_slurm.node.resident")
