"""Separate hosts: the plan of a cluster whose nodes are hosts of their own (pure).

Every node gets a network namespace (``ip netns``) with one veth (``eth0``) on a
Linux bridge, a mount namespace with private ``/run``, ``/tmp`` and ``/dev/shm``
and a UTS namespace whose hostname is the node name. Mount and UTS namespaces
are persistent: ``unshare --mount=<file> --uts=<file>`` binds them to files under
``/run/weave-hosts/<tag>/``, so daemons and later commands enter them with
``nsenter`` (:func:`host_argv`).

Network: one bridge per pool. The first pool's bridge is the hub: the login side
(this host's root namespace: slurmctld, weaved, the CLIs) has its address on it.
Every other pool's bridge is joined to the hub by one veth pair, the inter-pool
link, which :func:`tbf_argv` shapes in both directions; traffic inside a pool never
crosses it. All addresses come from one private subnet: the login is host 1, the
nodes are hosts 11, 12, ... in layout order. There is no route out, no NAT and no
forwarding: the nodes reach only each other and the login address.

File systems: on a node the cluster's state dir is an empty tmpfs, with only the
shared root (home, work, checkpoints), the node's own host dir, the site dir and
the Slurm config files (read-only) bound back in; the login-side files
(slurmctld's state, weaved's reserved dir) are not there. The rest of the
machine (system dirs, the repo and its venv) is the site software file system.

This module only computes names, addresses, argv lists and the setup script;
:mod:`weave_slurm.slurm.hosts` runs them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.slurm.cluster_config import (
    ClusterLayout,
    ClusterPaths,
    HostAddressing,
    HostMode,
)

DEFAULT_SUBNET = "10.214.0.0/24"
NS_ROOT = Path("/run/weave-hosts")
NETNS_DIR = Path("/run/netns")
MUNGE_KEY = Path("/etc/munge/munge.key")
NODE_IFNAME = "eth0"
LOGIN_HOST = 1          # the login's host number in the subnet
FIRST_NODE_HOST = 11    # the first node's host number; the others follow
QUEUE_LATENCY_MS = 20   # tbf queue: ~20 ms avoids a deep queue
MIN_BURST_KBIT = 512    # environment.md: at >= 1 Gbit/s a burst of 32 kbit is too small
_IFNAMSIZ = 15


@dataclass(frozen=True)
class Step:
    """One command of a plan, with the words an error names it by."""

    what: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class NodeHost:
    """One node as a host: its namespaces, its veth on its pool's bridge, its address."""

    name: str
    pool: str
    addr: str
    netns: str
    veth: str
    bridge: str
    mnt_file: Path
    uts_file: Path

    @property
    def netns_file(self) -> Path:
        return NETNS_DIR / self.netns

    def ns_files(self) -> tuple[Path, ...]:
        return (self.netns_file, self.mnt_file, self.uts_file)


@dataclass(frozen=True)
class PoolNet:
    """One pool's bridge, and for a pool other than the hub its link to the hub."""

    pool: str
    bridge: str
    link: tuple[str, str] | None  # (hub end, pool end) of the inter-pool veth pair


@dataclass(frozen=True)
class HostPlan:
    """Everything ``up`` creates for separate hosts, and ``down`` removes."""

    tag: str
    state_dir: Path
    subnet: str
    login_name: str
    login_addr: str
    pools: tuple[PoolNet, ...]
    nodes: tuple[NodeHost, ...]

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    @property
    def ns_dir(self) -> Path:
        """Where the persistent namespace files and the plan's own record live."""
        return NS_ROOT / self.tag

    @property
    def record(self) -> Path:
        return self.ns_dir / "hosts.json"

    @property
    def hub(self) -> str:
        return self.pools[0].bridge

    def node(self, name: str) -> NodeHost:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ConfigError(f"node {name!r} is not a host of the cluster in {self.state_dir}; "
                          f"nodes: {', '.join(n.name for n in self.nodes)}")

    def links(self) -> tuple[str, ...]:
        """Both ends of every inter-pool link (the devices that get shaped)."""
        return tuple(end for p in self.pools if p.link for end in p.link)

    def interfaces(self) -> tuple[str, ...]:
        """Every interface ``up`` creates in this host's root namespace."""
        return (*(p.bridge for p in self.pools), *self.links(), *(n.veth for n in self.nodes))

    def addressing(self) -> HostAddressing:
        return HostAddressing(self.login_name, self.login_addr,
                              tuple((n.name, n.addr) for n in self.nodes))

    def to_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "state_dir": str(self.state_dir), "subnet": self.subnet,
                "login": {"name": self.login_name, "addr": self.login_addr},
                "pools": [{"pool": p.pool, "bridge": p.bridge,
                           "link": list(p.link) if p.link else None} for p in self.pools],
                "nodes": [{"name": n.name, "pool": n.pool, "addr": n.addr, "netns": n.netns,
                           "veth": n.veth, "bridge": n.bridge, "mnt_file": str(n.mnt_file),
                           "uts_file": str(n.uts_file)} for n in self.nodes]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostPlan:
        try:
            pools = tuple(PoolNet(str(p["pool"]), str(p["bridge"]),
                                  (str(p["link"][0]), str(p["link"][1])) if p["link"] else None)
                          for p in data["pools"])
            nodes = tuple(NodeHost(str(n["name"]), str(n["pool"]), str(n["addr"]),
                                   str(n["netns"]), str(n["veth"]), str(n["bridge"]),
                                   Path(n["mnt_file"]), Path(n["uts_file"]))
                          for n in data["nodes"])
            return cls(str(data["tag"]), Path(data["state_dir"]), str(data["subnet"]),
                       str(data["login"]["name"]), str(data["login"]["addr"]), pools, nodes)
        except (KeyError, TypeError, IndexError) as exc:
            raise StateError(f"separate hosts: unreadable host plan ({exc!r}); remove the "
                             "cluster's namespaces with 'ip netns delete' by hand") from exc


def host_tag(state_dir: Path) -> str:
    """A short name prefix unique to one state dir: ``wv`` + 6 hex digits."""
    return "wv" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:6]


def parse_subnet(subnet: str, hosts_needed: int) -> ipaddress.IPv4Network:
    """The cluster's subnet: IPv4, private, with room for the login and every node."""
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError as exc:
        raise ConfigError(f"--subnet: {subnet!r} is not a network ({exc}); e.g. "
                          f"{DEFAULT_SUBNET!r}") from exc
    if not isinstance(net, ipaddress.IPv4Network) or not net.is_private:
        raise ConfigError(f"--subnet: {subnet!r} must be a private IPv4 network, e.g. "
                          f"{DEFAULT_SUBNET!r}")
    if net.num_addresses - 1 <= FIRST_NODE_HOST + hosts_needed:
        raise ConfigError(f"--subnet: {subnet!r} has no room for {hosts_needed} nodes (they "
                          f"start at host {FIRST_NODE_HOST}); use a larger one, e.g. /24")
    return net


def plan_hosts(state_dir: Path, layout: ClusterLayout, subnet: str,
               login_name: str) -> HostPlan:
    """Names and addresses of every host, bridge and link of the cluster in ``state_dir``."""
    names = layout.node_names()
    net = parse_subnet(subnet, len(names))
    tag = host_tag(state_dir)
    ns_dir = NS_ROOT / tag
    pools = tuple(PoolNet(p.partition, f"{tag}b{j}", (f"{tag}l{j}", f"{tag}p{j}") if j else None)
                  for j, p in enumerate(layout.pools))
    bridge_of = {p.pool: p.bridge for p in pools}
    nodes = []
    i = 0
    for pool in layout.pools:
        for name in pool.node_names():
            nodes.append(NodeHost(name, pool.partition, str(net[FIRST_NODE_HOST + i]),
                                  f"{tag}-{name}", f"{tag}n{i}", bridge_of[pool.partition],
                                  ns_dir / f"{name}.mnt", ns_dir / f"{name}.uts"))
            i += 1
    plan = HostPlan(tag, state_dir, str(net), login_name, str(net[LOGIN_HOST]), pools,
                    tuple(nodes))
    too_long = [d for d in plan.interfaces() if len(d) > _IFNAMSIZ]
    if too_long:
        raise ConfigError(f"cluster layout: too many nodes or pools for interface names "
                          f"({too_long[0]!r} is over {_IFNAMSIZ} characters)")
    return plan


def host_argv(node: NodeHost, argv: Sequence[str], cwd: Path | None = None) -> list[str]:
    """``argv`` run inside ``node``'s network, mount and UTS namespaces (as root)."""
    wd = [f"--wd={cwd}"] if cwd is not None else []
    return ["nsenter", f"--net={node.netns_file}", f"--mount={node.mnt_file}",
            f"--uts={node.uts_file}", *wd, "--", *(str(a) for a in argv)]


def as_user(user: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run as ``user`` (after :func:`host_argv` entered the namespaces as root)."""
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]


def create_steps(plan: HostPlan) -> list[Step]:
    """The ``ip`` commands that build the bridges, links and node namespaces, in order."""
    return bridge_steps(plan) + host_steps(plan)


def bridge_steps(plan: HostPlan) -> list[Step]:
    """The bridges and the login's address: what claims the subnet on this host."""
    steps: list[Step] = []
    for p in plan.pools:
        steps += [Step(f"create bridge {p.bridge} ({p.pool})",
                       ("ip", "link", "add", p.bridge, "type", "bridge")),
                  Step(f"bring up bridge {p.bridge}", ("ip", "link", "set", p.bridge, "up"))]
    steps.append(Step(f"give the login {plan.login_addr} on {plan.hub}",
                      ("ip", "addr", "add", f"{plan.login_addr}/{plan.prefixlen}", "dev",
                       plan.hub)))
    return steps


def host_steps(plan: HostPlan) -> list[Step]:
    """The inter-pool links and every node's netns, veth and addresses."""
    steps: list[Step] = []
    for p in plan.pools:
        if p.link:
            hub_end, pool_end = p.link
            steps += [Step(f"create the inter-pool link to {p.pool}",
                           ("ip", "link", "add", hub_end, "type", "veth", "peer", "name",
                            pool_end)),
                      Step(f"attach {hub_end} to {plan.hub}",
                           ("ip", "link", "set", hub_end, "master", plan.hub, "up")),
                      Step(f"attach {pool_end} to {p.bridge}",
                           ("ip", "link", "set", pool_end, "master", p.bridge, "up"))]
    for n in plan.nodes:
        steps += _node_net_steps(n, plan.prefixlen)
    return steps


def _node_net_steps(n: NodeHost, prefixlen: int) -> list[Step]:
    ns = ("ip", "-n", n.netns)
    return [Step(f"create netns of {n.name}", ("ip", "netns", "add", n.netns)),
            Step(f"create the veth of {n.name}",
                 ("ip", "link", "add", n.veth, "type", "veth", "peer", "name", NODE_IFNAME,
                  "netns", n.netns)),
            Step(f"attach {n.name} to {n.bridge}",
                 ("ip", "link", "set", n.veth, "master", n.bridge, "up")),
            Step(f"loopback up on {n.name}", (*ns, "link", "set", "lo", "up")),
            Step(f"address {n.addr} on {n.name}",
                 (*ns, "addr", "add", f"{n.addr}/{prefixlen}", "dev", NODE_IFNAME)),
            Step(f"bring up {NODE_IFNAME} on {n.name}", (*ns, "link", "set", NODE_IFNAME, "up"))]


def tbf_argv(dev: str, gbps: float) -> list[str]:
    """Shape ``dev``'s egress to ``gbps`` with tbf (netem does not work on this kernel)."""
    if gbps <= 0:
        raise ConfigError(f"--interpool-gbps: {gbps!r} must be > 0")
    mbit = max(1, round(gbps * 1000))
    burst_kbit = max(MIN_BURST_KBIT, mbit)  # about 1 ms at the rate
    return ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
            "burst", f"{burst_kbit}kbit", "latency", f"{QUEUE_LATENCY_MS}ms"]


def setup_argv(node: NodeHost, script: Path) -> list[str]:
    """Create ``node``'s persistent mount and UTS namespaces and run ``script`` in them.

    ``unshare`` runs inside the node's netns so that the fresh sysfs shows its
    interfaces. bash, not sh: dash takes no descriptor past 9, and the config files need
    more; it keeps the script open, so it may cover the script's own dir.
    """
    return ["nsenter", f"--net={node.netns_file}", "unshare", f"--mount={node.mnt_file}",
            f"--uts={node.uts_file}", "--propagation", "private", "bash", "-e", str(script)]


def render_setup_script(node: NodeHost, paths: ClusterPaths, munge_dir: Path) -> str:
    """The shell script that makes a fresh mount namespace into ``node``'s file systems.

    Open the parts of the state dir the node may see (as file descriptors), cover
    /run, /tmp, /dev/shm and the state dir with empty tmpfs, then bind the opened
    parts back at their own paths; so it works wherever the state dir lives (even
    under /tmp). Site files and Slurm configs are read-only.
    """
    q = shlex.quote
    s = paths.state_dir
    dirs = [(paths.shared_root, False), (paths.host_dir(node.name), False),
            (paths.site_dir, True)]
    keep = [(p, ro, False) for p, ro in dirs] + [(f, True, True) for f in paths.conf_files]
    fds = range(3, 3 + len(keep))
    cgroup_fd = 3 + len(keep)
    lines = [
        "exec " + " ".join(f"{fd}< {q(str(k[0]))}" for fd, k in zip(fds, keep, strict=True))
        + f" {cgroup_fd}< /sys/fs/cgroup",
        f"hostname {q(node.name)}",
        # a sysfs of the host's own netns (/sys/class/net), with the machine's cgroups
        "mount -t sysfs sysfs /sys",
        f"mount --no-canonicalize --rbind /proc/self/fd/{cgroup_fd} /sys/fs/cgroup",
        "mount -t tmpfs -o mode=0755 weave-run /run",
        "mount -t tmpfs -o mode=1777 weave-tmp /tmp",
        "mount -t tmpfs -o mode=1777 weave-shm /dev/shm",
        f"mkdir -p {q(str(s))}",
        f"mount -t tmpfs -o mode=0755 weave-login-side {q(str(s))}",
    ]
    for fd, (p, ro, is_file) in zip(fds, keep, strict=True):
        make = f"touch {q(str(p))}" if is_file else f"mkdir -p {q(str(p))}"
        lines += [make, f"mount --no-canonicalize --bind /proc/self/fd/{fd} {q(str(p))}"]
        if ro:
            lines.append(f"mount -o remount,bind,ro {q(str(p))}")
    lines += [
        "exec " + " ".join(f"{fd}<&-" for fd in (*fds, cgroup_fd)),
        f"mount --bind {q(str(paths.site_dir / 'hosts'))} /etc/hosts",
        f"mkdir -p {q(str(munge_dir))}",
        f"chown munge:munge {q(str(munge_dir))}",
        f"chmod 0755 {q(str(munge_dir))}",
        f"install -o munge -g munge -m 0400 {q(str(MUNGE_KEY))} {q(str(munge_dir / 'munge.key'))}",
        f"mkdir -p {q(str(paths.node_spool_dir(node.name, HostMode.SEPARATE)))}",
    ]
    return "\n".join(lines) + "\n"


def render_hosts_file(plan: HostPlan) -> str:
    """``/etc/hosts`` of every node: the site's name service for its hosts."""
    lines = ["# Generated by weave-slurm (weave cluster up --hosts separate).",
             "127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{plan.login_addr}\t{plan.login_name}"]
    lines += [f"{n.addr}\t{n.name}" for n in plan.nodes]
    return "\n".join(lines) + "\n"
