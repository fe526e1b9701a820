"""Where a cooperative member's processes find each other: addresses and ports.

A cooperative job's roles run on two hosts (its training node and its first rollout
node), and the other members of its group run on the same two hosts. So that they
never collide (two Ray heads on port 6379) and never find each other by accident
(``ray.init(address="auto")`` finds whichever cluster started last), weave tells each
role's processes, in their environment (docs/job_api.md, "Cooperative jobs"):

===================== ===============================================================
``WEAVE_TRAIN_ADDR``  the training node's address (Slurm's ``NodeAddr``), reachable
                      from the rollout node: where a Ray head started by the train
                      role listens
``WEAVE_ROLLOUT_ADDR`` the rollout node's address, reachable from the training node
``WEAVE_NODE_ADDR``   this role's own node's address (one of the two above)
``WEAVE_PORT_BASE``   the first port of the member's own range, on both nodes
``WEAVE_PORT_COUNT``  how many ports the range has (:data:`PORTS_PER_MEMBER`)
===================== ===============================================================

A range is a *slot*: the lowest one no other live cooperative member of this weaved
holds (:class:`PortSlots`), so two members of a group (or of two groups on one host,
as on the local backend) get disjoint ranges. The ranges lie under Linux's ephemeral
ports (32768 up), which the kernel hands to outgoing connections.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from weave_slurm.errors import InsufficientResources
from weave_slurm.runtime.group import NodeRef

#: The first port of slot 0, the ports per member, and how many slots fit under 32768.
PORT_FLOOR = 20000
PORTS_PER_MEMBER = 200
MAX_SLOTS = (32768 - PORT_FLOOR) // PORTS_PER_MEMBER
#: A node weaved reaches by its Unix socket runs on weaved's own host (local backend).
LOCAL_ADDR = "127.0.0.1"


def node_addr(node: NodeRef) -> str:
    """``node``'s address as its peers reach it."""
    return node.address or LOCAL_ADDR


@dataclass(frozen=True)
class MemberNet:
    """One member's two addresses and its port range."""

    train_addr: str
    rollout_addr: str
    slot: int

    @property
    def port_base(self) -> int:
        return PORT_FLOOR + self.slot * PORTS_PER_MEMBER

    def env(self, role: str) -> dict[str, str]:
        """The variables of ``role``'s processes (see module doc)."""
        own = self.train_addr if role == "train" else self.rollout_addr
        return {"WEAVE_TRAIN_ADDR": self.train_addr, "WEAVE_ROLLOUT_ADDR": self.rollout_addr,
                "WEAVE_NODE_ADDR": own, "WEAVE_PORT_BASE": str(self.port_base),
                "WEAVE_PORT_COUNT": str(PORTS_PER_MEMBER)}


class PortSlots:
    """Which member holds which port range, for every group of one weaved process."""

    def __init__(self, slots: int = MAX_SLOTS) -> None:
        self._slots = slots
        self._held: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()

    def take(self, owner: object, job_id: str) -> int:
        """``job_id``'s slot (the one it holds, else the lowest free one)."""
        key = (id(owner), job_id)
        with self._lock:
            if key in self._held:
                return self._held[key]
            used = set(self._held.values())
            free = next((s for s in range(self._slots) if s not in used), None)
            if free is None:
                raise InsufficientResources(
                    f"job {job_id}: all {self._slots} cooperative port ranges of "
                    f"{PORTS_PER_MEMBER} ports from {PORT_FLOOR} are held: at most "
                    f"{self._slots} cooperative jobs run at once under one weaved")
            self._held[key] = free
            return free

    def give(self, owner: object, job_id: str) -> None:
        with self._lock:
            self._held.pop((id(owner), job_id), None)

    def held(self, owner: object) -> set[str]:
        """The jobs ``owner`` holds a slot for."""
        with self._lock:
            return {job for (who, job) in self._held if who == id(owner)}


#: The slots of this process's weaved (all its groups' runners share it).
SLOTS = PortSlots()
