"""Parse ``sinfo --json`` (Slurm 22.05, OpenAPI v0.0.38) into :class:`NodeInfo`."""

from __future__ import annotations

import logging
from typing import Any

from weave_slurm.slurm.backend import NodeInfo
from weave_slurm.slurm.squeue import gpus_per_node, load_json

log = logging.getLogger(__name__)


def _state(node: dict[str, Any]) -> str:
    raw = node.get("state")
    names = [str(s) for s in raw] if isinstance(raw, list) else [str(raw or "unknown")]
    flags = node.get("state_flags") or []
    words = [n.lower() for n in names] + [str(f).lower() for f in flags]
    return "+".join(words)


def parse_nodes(text: str) -> tuple[NodeInfo, ...]:
    """Every node sinfo reports, sorted by name; malformed entries are skipped."""
    data = load_json(text, "sinfo --json")
    out = []
    for node in data.get("nodes") or []:
        if not isinstance(node, dict) or not node.get("name"):
            log.warning("sinfo --json: node without a name skipped")
            continue
        gpu_type, gpu_count = gpus_per_node(str(node.get("gres") or ""))
        cpus = node.get("cpus")
        out.append(NodeInfo(name=str(node["name"]),
                            partitions=tuple(str(p) for p in node.get("partitions") or []),
                            state=_state(node),
                            cpus=cpus if isinstance(cpus, int) else 0,
                            gpu_type=gpu_type, gpu_count=gpu_count,
                            address=str(node.get("address") or node.get("hostname") or "")))
    return tuple(sorted(out, key=lambda n: n.name))
