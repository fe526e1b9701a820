"""A cooperative member's own Ray cluster (docs/recipes.md, the Ray pattern of verl and
OpenRLHF): the ``ray start`` flags, the driver's ``ray.init``, the gate relay actor and
the node affinity of the rollout side, all from what weave sets in each role's
environment (docs/job_api.md, "Cooperative jobs"; runtime/member_net.py).

- The **train** role starts the head on its node (``WEAVE_TRAIN_ADDR``), the **rollout**
  role joins it from its node, both on ports of the member's own range
  (``WEAVE_PORT_BASE``, ``WEAVE_PORT_COUNT``) and with the object store the spec
  declared (``WEAVE_OBJECT_STORE_BYTES``; one that declared none is refused), never
  Ray's 30% of RAM::

      ray start --head $(python -m weave_slurm.ray_member args) && exec python -u driver.py
      exec ray start --block $(python -m weave_slurm.ray_member args)

  ``args`` of the rollout role waits (at most :data:`HEAD_WAIT_S`) until the head's
  port answers, so the two lines may start in either order.
- The rollout node carries the custom resource :data:`ROLLOUT_RESOURCE`, which is how
  :func:`on_rollout_node` finds it (addresses may be alike: the local backend).
- :func:`gate_relay` is the Ray actor class that holds the rollout turn on the rollout
  node for the driver; Ray's workers there inherit ``WEAVE_NODE_SOCKET`` and
  ``WEAVE_JOB_ID`` from the rollout role's ``ray start``.

Ray is imported only by the functions that need it (the ``ray`` extra).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from weave_slurm.errors import ConfigError, StateError

#: Offsets in the member's port range: the head's GCS, then each node's own services
#: (the head's at +1.., the rollout node's at +11..: both may be on one host), then
#: each node's half of the rest for Ray's worker processes.
GCS = 0
SERVICES = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port",
            "dashboard-port")
NODE_OFFSET = {"train": 1, "rollout": 11}
WORKERS_FROM = 20
#: The custom resource of the rollout node (one unit).
ROLLOUT_RESOURCE = "weave_rollout_node"
#: How long the rollout role's ``args`` and :func:`on_rollout_node` wait for the other.
HEAD_WAIT_S = 120.0
_NEEDED = ("WEAVE_ROLE", "WEAVE_TRAIN_ADDR", "WEAVE_NODE_ADDR", "WEAVE_PORT_BASE",
           "WEAVE_PORT_COUNT", "WEAVE_JOB_ID")


def _need(env: Mapping[str, str]) -> dict[str, str]:
    missing = [k for k in _NEEDED if not env.get(k)]
    if missing:
        raise ConfigError(f"ray_member: {', '.join(missing)} not set; run it in a role of a "
                          "weave cooperative job ([launch], docs/job_api.md)")
    if env["WEAVE_ROLE"] not in NODE_OFFSET:
        raise ConfigError(f"ray_member: WEAVE_ROLE={env['WEAVE_ROLE']!r}; valid: "
                          f"{', '.join(NODE_OFFSET)}")
    return {k: env[k] for k in _NEEDED}


def head_address(env: Mapping[str, str] = os.environ) -> str:
    """``host:port`` of the member's Ray head (its GCS), for ``ray.init`` and joining."""
    got = _need(env)
    return f"{got['WEAVE_TRAIN_ADDR']}:{int(got['WEAVE_PORT_BASE']) + GCS}"


def start_args(env: Mapping[str, str] = os.environ) -> list[str]:
    """The flags of this role's ``ray start`` (pure: see module doc)."""
    got = _need(env)
    role, base, count = got["WEAVE_ROLE"], int(got["WEAVE_PORT_BASE"]), \
        int(got["WEAVE_PORT_COUNT"])
    if count < WORKERS_FROM + 4:
        raise ConfigError(f"ray_member: WEAVE_PORT_COUNT={count}; needs at least "
                          f"{WORKERS_FROM + 4}")
    half = (count - WORKERS_FROM) // 2
    low = base + WORKERS_FROM + (half if role == "rollout" else 0)
    args = [f"--node-ip-address={got['WEAVE_NODE_ADDR']}",
            *(f"--{flag}={base + NODE_OFFSET[role] + i}" for i, flag in enumerate(SERVICES)),
            f"--min-worker-port={low}", f"--max-worker-port={low + half - 1}",
            "--disable-usage-stats"]
    if role == "train":
        args += [f"--port={base + GCS}", "--include-dashboard=false",
                 f"--temp-dir=/tmp/weave-ray-{got['WEAVE_JOB_ID']}"]
    else:
        args += [f"--address={head_address(env)}",
                 f"--resources={json.dumps({ROLLOUT_RESOURCE: 1}, separators=(',', ':'))}"]
    store = env.get("WEAVE_OBJECT_STORE_BYTES")
    if not store:
        raise ConfigError("ray_member: the job's spec declares no '[launch] "
                          "object_store_gib' (WEAVE_OBJECT_STORE_BYTES is not set); without "
                          "it Ray takes 30% of the node's RAM outside weave's host-memory "
                          "budget: declare it, in GiB per node")
    return [*args, f"--object-store-memory={int(store)}"]


def wait_for_head(env: Mapping[str, str] = os.environ, timeout_s: float = HEAD_WAIT_S) -> None:
    """Block until the member's head accepts connections on its GCS port."""
    host, port = head_address(env).rsplit(":", 1)
    end = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2.0):
                return
        except OSError as exc:
            if time.monotonic() > end:
                raise StateError(f"ray_member: the member's Ray head at {host}:{port} did "
                                 f"not answer in {timeout_s:g} s: {exc}") from None
            time.sleep(0.2)


def init(**kwargs: Any) -> Any:
    """``ray.init`` on the member's own head (never ``address="auto"``)."""
    import ray

    env = _need(os.environ)
    return ray.init(address=head_address(), _node_ip_address=env["WEAVE_NODE_ADDR"],
                    **kwargs)


def on_rollout_node(timeout_s: float = HEAD_WAIT_S) -> Any:
    """A hard node affinity to the member's rollout node, once it joined."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    end = time.monotonic() + timeout_s
    while True:
        every: list[dict[str, Any]] = ray.nodes()   # type: ignore[no-untyped-call]
        nodes = [n["NodeID"] for n in every
                 if n.get("Alive") and ROLLOUT_RESOURCE in n.get("Resources", {})]
        if nodes:
            return NodeAffinitySchedulingStrategy(nodes[0], soft=False)
        if time.monotonic() > end:
            raise StateError(f"ray_member: no rollout node joined the member's Ray cluster "
                             f"in {timeout_s:g} s (resource {ROLLOUT_RESOURCE!r})")
        time.sleep(0.2)


class _Relay:
    """Holds the rollout turn on the rollout node: ``enter`` blocks until weave grants
    it, ``leave`` hands it back with the rollout's metrics."""

    def __init__(self) -> None:
        from weave_slurm import gate

        self._gate = gate.connect()
        self._turn: Any = None

    def enter(self, version: int) -> int:
        self._turn = self._gate.acquire("rollout", version)
        return int(self._turn.version)

    def leave(self, **metrics: float) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            raise StateError("gate relay: leave without enter")
        turn.report(**metrics)
        self._gate.release(turn)


def gate_relay() -> Any:
    """The gate relay as a Ray actor class (``gate_relay().options(...).remote()``)."""
    import ray

    return ray.remote(num_cpus=0)(_Relay)


def main(argv: list[str]) -> int:
    if argv != ["args"]:
        print("usage: python -m weave_slurm.ray_member args", file=sys.stderr)
        return 2
    try:
        if os.environ.get("WEAVE_ROLE") == "rollout":
            wait_for_head()
        print(" ".join(start_args()))
    except (ConfigError, StateError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
