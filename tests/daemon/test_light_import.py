"""weaved and its clients start without torch or numpy: the wire values they read
(``WorkerState``, ``WorkerStatus``) live in ``node/protocol.py``, not on the node side
whose segments map shared memory through torch. Each import runs in a fresh interpreter,
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
])
def test_weaved_and_its_clients_import_no_torch_or_numpy(module: str) -> None:
    assert heavy_after_import(module) == []


def test_the_probe_sees_torch_where_the_node_side_imports_it() -> None:
    """The node's segment store does need torch: so the probe above can fail."""
    pytest.importorskip("torch")
    assert "torch" in heavy_after_import("weave_slurm.node.segments")
