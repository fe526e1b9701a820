"""The sync agents of one group layout: one per node, their processes and control lines.

Each agent (:mod:`weave_slurm.sync.agent`) runs on its node, started by a
:data:`Launcher`: as a one-task step of the node's allocation (``Backend.open_step``;
on Slurm an ``srun --overlap`` whose stdin and stdout travel over Slurm's
authenticated I/O forwarding), or as a local process where weaved shares the host
with its "nodes" (:func:`local_launcher`). Its stdin and stdout are its control
channel. Rank 0, the first training node's agent, is started first: it picks the
rendezvous port on its node's address and says where; the others are started with it.

Ranks: training nodes first, then rollout nodes, in layout order (as
:func:`~weave_slurm.sync.topology.build_topology` numbers one rank per node). Any
failure other than a refusal (``VersionMismatch``) stops them all: a process group
with a dead or timed-out rank is not reused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weave_slurm.errors import StateError, VersionMismatch, WeaveError
from weave_slurm.runtime.group import GroupLayout, NodeRef
from weave_slurm.slurm.backend import StepSpec
from weave_slurm.slurm.command_runner import PipedProcess
from weave_slurm.sync.sync_errors import AgentDidNotStart, SyncError
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)

AgentKey = tuple[Pool, str]
#: Starts one agent on ``node`` (``spec``: its argv, env and stderr log); its pipes are
#: the control channel.
Launcher = Callable[[NodeRef, StepSpec], PipedProcess]
STEP_NAME = "weave-sync"

#: Errors after which every agent is still in step (the protocol ran to its end, or
#: never started): the agents are kept. Any other error stops them all.
CLEAN_ERRORS = frozenset({"VersionMismatch", "ShardCorrupt", "StateError",
                          "InsufficientResources", "ConfigError"})


def local_launcher(node: NodeRef, spec: StepSpec) -> PipedProcess:
    """A plain local process (weaved shares the host with ``node``)."""
    assert spec.log_path is not None
    with spec.log_path.open("ab") as err:
        return subprocess.Popen(list(spec.argv), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err,
                                env={**os.environ, **spec.env}, start_new_session=True)


@dataclass
class _Agent:
    key: AgentKey
    rank: int
    proc: PipedProcess
    log_path: Path
    pid: int = 0                                   # the agent's own (not srun's)
    buf: bytearray = field(default_factory=bytearray)


class AgentGroup:
    """The agents of one layout (see module doc)."""

    def __init__(self, layout: GroupLayout, timeout_s: float, start_timeout_s: float,
                 mode: str, launcher: Launcher | None = None,
                 python: str = sys.executable) -> None:
        self.timeout_s, self.start_timeout_s, self.mode = timeout_s, start_timeout_s, mode
        self.launcher = launcher or local_launcher
        self.python = python
        self.world = [(Pool.TRAIN, n) for n in layout.train] + \
            [(Pool.ROLLOUT, n) for n in layout.rollout]
        self.dir = Path(tempfile.mkdtemp(prefix="weave-sync-agents-"))
        self._agents: dict[AgentKey, _Agent] = {}
        self.stopped = False

    def nodes(self) -> list[AgentKey]:
        return list(self._agents)

    def pid(self, key: AgentKey) -> int:
        """The agent process's own pid (on its node)."""
        return self._agents[key].pid

    def pids(self) -> list[int]:
        return [a.pid for a in self._agents.values()]

    # -- start -------------------------------------------------------------------------
    def start(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        first = self.world[0][1]
        host = first.address or "127.0.0.1"
        self._launch(0, f"tcp://{host}:0")
        first_agent = self._agents[self.world[0][0], first.name]
        line = self._line(first_agent, deadline, "say where to meet")
        if not line.startswith("RENDEZVOUS "):
            raise self._dead(first_agent, f"said {line!r}, not its rendezvous")
        init = line.split(" ", 1)[1]
        for rank in range(1, len(self.world)):
            self._launch(rank, init)
        self._joined(deadline)
        self.request({k: {"op": "ping"} for k in self._agents},
                     max(1.0, deadline - time.monotonic()))
        log.info("sync agents up (%s): %s", init, ", ".join(
            f"{k[1]}={a.pid}" for k, a in self._agents.items()))

    def _launch(self, rank: int, init: str) -> None:
        from weave_slurm.sync.agent import AgentSpec

        pool, node = self.world[rank]
        world = tuple((p.value, n.name) for p, n in self.world)
        spec = AgentSpec(rank, world, init, str(node.socket_path), self.timeout_s, self.mode)
        log_path = self.dir / f"agent{rank}-{node.name}.err"
        step = StepSpec(STEP_NAME, (self.python, "-m", "weave_slurm.sync.agent", spec.dumps()),
                        ntasks=1, node_count=1, nodelist=(node.slurm_host,),
                        env={"OMP_NUM_THREADS": "1"}, log_path=log_path)
        proc = self.launcher(node, step)
        self._agents[(pool, node.name)] = _Agent((pool, node.name), rank, proc, log_path)

    def _line(self, agent: _Agent, deadline: float, what: str) -> str:
        """The agent's next line, or SyncError at ``deadline``."""
        return self._lines([agent], deadline, what)[agent.key]

    def _joined(self, deadline: float) -> None:
        """Every agent's READY line (see :meth:`_lines`: the first agent to exit fails
        the start then; the others would only wait for it to join their group)."""
        for key, line in self._lines(list(self._agents.values()), deadline,
                                     "join the group").items():
            self._ready(self._agents[key], line)

    def _lines(self, agents: list[_Agent], deadline: float, what: str) -> dict[AgentKey, str]:
        """The next line of each of ``agents``, read as they come. The first agent to
        exit (an srun to a node Slurm has failed ends at once) fails it then, not at
        ``deadline``; none by ``deadline`` fails it naming the first still silent."""
        waiting = {a.key: a for a in agents if b"\n" not in a.buf}
        with selectors.DefaultSelector() as sel:
            for agent in waiting.values():
                assert agent.proc.stdout is not None
                sel.register(agent.proc.stdout.fileno(), selectors.EVENT_READ, agent.key)
            while waiting:
                events = sel.select(max(0.0, deadline - time.monotonic()))
                if not events:
                    raise self._dead(next(iter(waiting.values())), f"did not {what} "
                                     f"within {self.start_timeout_s:.0f} s")
                for ev, _ in events:
                    agent = waiting[ev.data]
                    chunk = os.read(ev.fd, 1 << 16)
                    if not chunk:
                        raise self._dead(agent, f"exited before it could {what}",
                                         AgentDidNotStart)
                    agent.buf.extend(chunk)
                    if b"\n" in agent.buf:
                        sel.unregister(ev.fileobj)
                        del waiting[agent.key]
        return {a.key: self._text_line(a) for a in agents}

    def _ready(self, agent: _Agent, line: str) -> None:
        if not line.startswith("READY "):
            raise self._dead(agent, f"said {line!r}, not READY")
        agent.pid = int(line.split()[1])

    @staticmethod
    def _text_line(agent: _Agent) -> str:
        line, _, rest = bytes(agent.buf).partition(b"\n")
        agent.buf[:] = rest
        return line.decode(errors="replace").strip()

    # -- requests ----------------------------------------------------------------------
    def request(self, requests: dict[AgentKey, dict[str, Any]], timeout_s: float
                ) -> dict[AgentKey, dict[str, Any]]:
        """Send each agent its request, then wait for every reply (at most ``timeout_s``).

        A refused version raises ``VersionMismatch`` (agents kept); any other failure
        stops every agent and raises ``SyncError`` naming the node and the reason.
        """
        try:
            replies = self._exchange(requests, timeout_s)
        except SyncError:
            self.stop(grace_s=1.0)
            raise
        failed = {k: r for k, r in replies.items() if not r.get("ok")}
        if not failed:
            return replies
        broken = [k for k, r in failed.items() if r.get("error") not in CLEAN_ERRORS]
        refusals = [k for k, r in failed.items() if r.get("error") == "VersionMismatch"]
        first_key = (broken or refusals or list(failed))[0]
        first = failed[first_key]
        why = (f"sync agent on {first_key[1]}: {first.get('error')}: {first.get('message')}"
               + (f" (and {len(failed) - 1} more agents)" if len(failed) > 1 else ""))
        if broken:
            self.stop(grace_s=1.0)
            raise SyncError(why)
        if refusals:
            raise VersionMismatch(why)
        raise StateError(why)

    def _exchange(self, requests: dict[AgentKey, dict[str, Any]], timeout_s: float
                  ) -> dict[AgentKey, dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        for key, req in requests.items():
            agent = self._agents[key]
            assert agent.proc.stdin is not None
            try:
                agent.proc.stdin.write(json.dumps(req).encode() + b"\n")
                agent.proc.stdin.flush()
            except OSError as exc:
                raise self._dead(agent, f"control channel: {exc}") from exc
        replies: dict[AgentKey, dict[str, Any]] = {}
        with selectors.DefaultSelector() as sel:
            for key in requests:
                agent = self._agents[key]
                if b"\n" in agent.buf:            # a line that arrived with an earlier one
                    replies[key] = self._take_line(agent)
                    continue
                assert agent.proc.stdout is not None
                sel.register(agent.proc.stdout.fileno(), selectors.EVENT_READ, key)
            while len(replies) < len(requests):
                left = deadline - time.monotonic()
                events = sel.select(max(0.0, left)) if left > 0 else []
                if not events:
                    late = [k[1] for k in requests if k not in replies]
                    raise SyncError(f"sync agents on {', '.join(late)}: no reply within "
                                    f"{timeout_s:.0f} s")
                for ev, _ in events:
                    agent = self._agents[ev.data]
                    reply = self._read_reply(agent)
                    if reply is None:
                        continue
                    replies[agent.key] = reply
                    sel.unregister(ev.fileobj)
                    if not reply.get("ok") and reply.get("error") not in CLEAN_ERRORS:
                        return replies      # the world is broken: do not wait for the rest
        return replies

    def _read_reply(self, agent: _Agent) -> dict[str, Any] | None:
        assert agent.proc.stdout is not None
        try:
            data = os.read(agent.proc.stdout.fileno(), 1 << 16)
        except OSError as exc:
            raise self._dead(agent, f"control channel: {exc}") from exc
        if not data:
            raise self._dead(agent, "closed its control channel")
        agent.buf.extend(data)
        return self._take_line(agent) if b"\n" in agent.buf else None

    @staticmethod
    def _take_line(agent: _Agent) -> dict[str, Any]:
        line, _, rest = bytes(agent.buf).partition(b"\n")
        agent.buf[:] = rest
        return dict(json.loads(line))

    def _dead(self, agent: _Agent, what: str,
              error: type[SyncError] = SyncError) -> WeaveError:
        with contextlib.suppress(Exception):
            agent.proc.wait(timeout=0.2)
        code = agent.proc.poll()
        tail = ""
        with contextlib.suppress(OSError):
            lines = agent.log_path.read_text(errors="replace").strip().splitlines()
            tail = f": {lines[-1]}" if lines else ""
        state = "running" if code is None else f"exit {code}"
        return error(f"sync agent on {agent.key[1]} (pid {agent.pid or agent.proc.pid}, "
                     f"{state}) {what}{tail}")

    # -- stop --------------------------------------------------------------------------
    def stop(self, grace_s: float = 5.0) -> None:
        """Ask every agent to stop (and close its stdin), then kill what is left."""
        for agent in self._agents.values():
            if agent.proc.stdin is not None and agent.proc.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    agent.proc.stdin.write(b'{"op": "stop"}\n')
                    agent.proc.stdin.close()
        deadline = time.monotonic() + grace_s
        for agent in self._agents.values():
            try:
                agent.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                agent.proc.kill()
                agent.proc.wait()
            except WeaveError:     # a fake or remote process that cannot be waited for
                agent.proc.kill()
            if agent.proc.stdout is not None:
                agent.proc.stdout.close()
        self._agents.clear()
        self.stopped = True
        shutil.rmtree(self.dir, ignore_errors=True)
