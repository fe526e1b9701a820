"""An emulated pair of pools joined by a slow link, for tests and benchmarks.

:class:`EmulatedLink` puts the training pool and the rollout pool into two network
namespaces joined by one veth pair whose both directions are rate-limited with
``tc qdisc ... tbf`` (this machine has no ``netem``). Traffic inside a namespace is
unshaped. Addresses come from 10.213.0.0/16 and namespace names carry the pid, so
parallel runs do not collide; leaving the context always removes what was created.
``LinkSpec(rate_mbit=None)`` is the loopback mode: no namespaces, everything on ``lo``.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from weave_slurm.errors import ConfigError, ExternalCommandError
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)

_counter = itertools.count()
_IP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class LinkSpec:
    """The slow link; ``rate_mbit=None`` means loopback (no namespaces, no shaping)."""

    rate_mbit: int | None = 1000
    burst_kbit: int = 512
    latency_ms: int = 400


@dataclass(frozen=True)
class Endpoint:
    """Where one pool's ranks run: their namespace (None = host), address and interface."""

    netns: str | None
    addr: str
    ifname: str

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this endpoint's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)

    def env(self) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": self.ifname, "OMPI_MCA_btl_tcp_if_include": self.ifname,
                "OMPI_MCA_oob_tcp_if_include": self.ifname}


def run_ip(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """The one door for ``ip`` and ``tc`` commands: errors carry argv, code and output."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=_IP_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExternalCommandError(list(argv), None, "", str(exc), what="link setup") from exc
    if check and done.returncode != 0:
        raise ExternalCommandError(list(argv), done.returncode, done.stdout, done.stderr,
                                   what="link setup")
    return done


class EmulatedLink:
    """Context manager: two namespaces joined by a shaped veth pair (or plain loopback)."""

    def __init__(self, spec: LinkSpec) -> None:
        if spec.rate_mbit is not None and spec.rate_mbit <= 0:
            raise ConfigError(f"link rate_mbit must be > 0 or None (loopback), got "
                              f"{spec.rate_mbit!r}")
        self.spec = spec
        n = next(_counter)
        tag = f"{os.getpid() % 100000}-{n}"
        self._ns = {Pool.TRAIN: f"wvs-t-{tag}", Pool.ROLLOUT: f"wvs-r-{tag}"}
        self._if = {Pool.TRAIN: f"wvt{tag}"[:15], Pool.ROLLOUT: f"wvr{tag}"[:15]}
        subnet = (os.getpid() * 7 + n) % 16000
        base = f"10.213.{subnet // 64}.{(subnet % 64) * 4}"
        prefix = base.rsplit(".", 1)[0]
        last = int(base.rsplit(".", 1)[1])
        self._addr = {Pool.TRAIN: f"{prefix}.{last + 1}", Pool.ROLLOUT: f"{prefix}.{last + 2}"}
        self._created: list[str] = []

    def endpoint(self, pool: Pool) -> Endpoint:
        if self.spec.rate_mbit is None:
            return Endpoint(None, "127.0.0.1", "lo")
        return Endpoint(self._ns[pool], self._addr[pool], self._if[pool])

    def __enter__(self) -> EmulatedLink:
        if self.spec.rate_mbit is None:
            return self
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _create(self) -> None:
        for pool in Pool:
            run_ip(["ip", "netns", "add", self._ns[pool]])
            self._created.append(self._ns[pool])
        t_if, r_if = self._if[Pool.TRAIN], self._if[Pool.ROLLOUT]
        run_ip(["ip", "link", "add", t_if, "netns", self._ns[Pool.TRAIN], "type", "veth",
                "peer", "name", r_if, "netns", self._ns[Pool.ROLLOUT]])
        spec = self.spec
        for pool in Pool:
            ns, ifname = self._ns[pool], self._if[pool]
            ex = ["ip", "netns", "exec", ns]
            run_ip([*ex, "ip", "link", "set", "lo", "up"])
            run_ip([*ex, "ip", "addr", "add", f"{self._addr[pool]}/30", "dev", ifname])
            run_ip([*ex, "ip", "link", "set", ifname, "up"])
            run_ip([*ex, "tc", "qdisc", "add", "dev", ifname, "root", "tbf", "rate",
                    f"{spec.rate_mbit}mbit", "burst", f"{spec.burst_kbit}kbit", "latency",
                    f"{spec.latency_ms}ms"])
        log.info("emulated link %s <-> %s at %s Mbit/s", self._addr[Pool.TRAIN],
                 self._addr[Pool.ROLLOUT], spec.rate_mbit)

    def close(self) -> None:
        """Delete the namespaces (and with them the veth pair); safe to call twice."""
        while self._created:
            ns = self._created.pop()
            done = run_ip(["ip", "netns", "delete", ns], check=False)
            if done.returncode != 0:
                log.warning("could not delete netns %s: %s", ns, done.stderr.strip())


def namespace_exists(name: str) -> bool:
    done = run_ip(["ip", "netns", "list"], check=False)
    return any(line.split()[0] == name for line in done.stdout.splitlines() if line.strip())
