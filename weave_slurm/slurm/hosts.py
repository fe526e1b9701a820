"""Separate hosts, the side effects: build, shape, search and remove a :class:`HostPlan`.

``create`` checks that nothing it would make exists yet and that the subnet is
free, records the plan in ``/run/weave-hosts/<tag>/hosts.json`` (outside the state
dir, so that ``down`` finds it even after the state dir is gone), builds the
bridges, links and node namespaces, and runs each node's setup script.
``processes_in`` finds every process in one of the cluster's namespaces (network,
mount or UTS: slurmd, munged, slurmstepd, tasks, anything entered with ``nsenter``),
for ``down`` to end (:func:`weave_slurm.slurm.daemons.sweep`); ``destroy`` then
removes every interface, namespace and mount of the plan and reports what it could
not. Every command goes through the runner (the one door).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from filelock import FileLock

from weave_slurm.errors import ConfigError, ExternalCommandError, StateError
from weave_slurm.slurm.cluster_config import ClusterPaths
from weave_slurm.slurm.command_runner import CommandResult, CommandRunner, SlurmCommandError
from weave_slurm.slurm.daemons import Proc, process_table
from weave_slurm.slurm.host_plan import (
    NS_ROOT,
    HostPlan,
    Step,
    bridge_steps,
    host_steps,
    host_tag,
    render_setup_script,
    setup_argv,
    tbf_argv,
)

log = logging.getLogger(__name__)

_TIMEOUT_S = 20.0
_NS_KINDS = ("net", "mnt", "uts")
_OCTAL = re.compile(r"\\([0-7]{3})")  # mountinfo escapes space, tab, newline, backslash


def run_step(runner: CommandRunner, step: Step, *, check: bool = True) -> CommandResult:
    """Run one step; a failure names the step and carries argv, exit code and stderr."""
    try:
        return runner.run(step.argv, timeout_s=_TIMEOUT_S, check=check)
    except SlurmCommandError as exc:
        raise ExternalCommandError(exc.argv, exc.returncode, exc.stdout, exc.stderr,
                                   what=f"separate hosts: {step.what}") from exc


# -- reading the world ---------------------------------------------------------------


def read_plan(state_dir: Path) -> HostPlan | None:
    """The plan recorded for ``state_dir`` by an earlier ``create``; None if there is none."""
    record = NS_ROOT / host_tag(state_dir) / "hosts.json"
    try:
        data = json.loads(record.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateError(f"separate hosts: cannot read {record}: {exc}") from exc
    return HostPlan.from_json(data)


def link_names(runner: CommandRunner) -> set[str]:
    res = run_step(runner, Step("list interfaces", ("ip", "-o", "link", "show")))
    names = set()
    for line in res.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            names.add(parts[1].strip().split("@", 1)[0])
    return names


def netns_names(runner: CommandRunner) -> set[str]:
    res = run_step(runner, Step("list network namespaces", ("ip", "netns", "list")))
    return {line.split()[0] for line in res.stdout.splitlines() if line.strip()}


def mount_points() -> set[Path]:
    """Mount points of this process's mount namespace (/proc/self/mountinfo)."""
    out = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:
                out.add(Path(_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4])))
    return out


def check_free(plan: HostPlan, runner: CommandRunner) -> None:
    """Refuse to build over interfaces, namespaces or routes that are not ours."""
    clash = sorted(set(plan.interfaces()) & link_names(runner))
    if clash:
        raise StateError(f"separate hosts: interface {clash[0]!r} exists but no record of "
                         f"it does; remove it with 'ip link del {clash[0]}'")
    ns_clash = sorted({n.netns for n in plan.nodes} & netns_names(runner))
    if ns_clash:
        raise StateError(f"separate hosts: netns {ns_clash[0]!r} exists but no record of it "
                         f"does; remove it with 'ip netns delete {ns_clash[0]}'")
    net = ipaddress.ip_network(plan.subnet)
    res = run_step(runner, Step("list routes", ("ip", "-o", "-4", "route", "show")))
    for line in res.stdout.splitlines():
        dst = _route_dst(line)
        if dst is not None and dst.overlaps(net):
            raise ConfigError(f"--subnet: {plan.subnet} overlaps the route {line.strip()!r}"
                              " of this host; choose another subnet")


def free_subnet(runner: CommandRunner, first: str) -> str:
    """``first`` (a /24), or the next /24 of its /16 after it (wrapping round) that no
    route of this host overlaps (another cluster's, a site network's); ConfigError if
    none is."""
    base = ipaddress.ip_network(first)
    wide = base.supernet(new_prefix=16)
    res = run_step(runner, Step("list routes", ("ip", "-o", "-4", "route", "show")))
    taken = [dst for line in res.stdout.splitlines()
             for dst in [_route_dst(line)] if dst is not None]
    start = (int(base.network_address) >> 8) & 0xFF
    for k in range(256):
        third = (start + k) % 256
        net = ipaddress.ip_network((int(wide.network_address) + (third << 8), 24))
        if not any(net.overlaps(t) for t in taken):
            return str(net)
    raise ConfigError(f"--subnet: every /24 of {wide} overlaps a route of this host; give "
                      "a free private one")


def _route_dst(line: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The destination of one ``ip route`` line (after a type such as ``unreachable``)."""
    for word in line.split()[:2]:
        with contextlib.suppress(ValueError):
            return ipaddress.ip_network(word, strict=False)
    return None  # default, or not a route line


# -- acting --------------------------------------------------------------------------


def create(plan: HostPlan, paths: ClusterPaths, munge_dir: Path,
           runner: CommandRunner) -> None:
    """Record the plan, then build its network and each node's namespaces."""
    NS_ROOT.mkdir(parents=True, exist_ok=True)
    with FileLock(NS_ROOT / ".lock"):  # two clusters must not both find a subnet free
        check_free(plan, runner)
        plan.ns_dir.mkdir(parents=True, exist_ok=True)
        plan.record.write_text(json.dumps(plan.to_json(), indent=2) + "\n")
        for step in bridge_steps(plan):
            run_step(runner, step)
    if plan.ns_dir not in mount_points():
        # unshare binds a mount namespace only onto a mount that does not propagate
        run_step(runner, Step("bind the namespace dir", ("mount", "--bind", str(plan.ns_dir),
                                                          str(plan.ns_dir))))
        run_step(runner, Step("make the namespace dir private",
                              ("mount", "--make-private", str(plan.ns_dir))))
    for step in host_steps(plan):
        run_step(runner, step)
    for node in plan.nodes:
        for f in (node.mnt_file, node.uts_file):
            f.touch()
        script = paths.run_dir / f"setup-{node.name}.sh"
        script.write_text(render_setup_script(node, paths, munge_dir))
        run_step(runner, Step(f"make the file systems of host {node.name} ({script})",
                              tuple(setup_argv(node, script))))
    log.info("separate hosts up: %d nodes on %s", len(plan.nodes), plan.subnet)


def shape(plan: HostPlan, gbps: float | None, runner: CommandRunner) -> None:
    """Shape both directions of every inter-pool link to ``gbps``; None removes shaping."""
    for dev in plan.links():
        if gbps is not None:
            run_step(runner, Step(f"shape {dev} to {gbps:g} Gbit/s", tuple(tbf_argv(dev, gbps))))
            continue
        res = run_step(runner, Step(f"read the qdisc of {dev}",
                                    ("tc", "qdisc", "show", "dev", dev, "root")))
        if " tbf " in f" {res.stdout} ":
            run_step(runner, Step(f"unshape {dev}", ("tc", "qdisc", "del", "dev", dev, "root")))


def namespace_ids(plan: HostPlan) -> dict[tuple[int, int], str]:
    """(device, inode) of each namespace of the plan that still exists -> its node."""
    nsfs = os.stat("/proc/self/ns/net").st_dev
    out = {}
    for node in plan.nodes:
        for f in node.ns_files():
            with contextlib.suppress(OSError):
                st = os.stat(f)
                if st.st_dev == nsfs:  # a bound namespace, not the empty file under it
                    out[(st.st_dev, st.st_ino)] = node.name
    return out


def processes_in(ids: dict[tuple[int, int], str],
                 table: dict[int, Proc] | None = None) -> dict[int, tuple[int, str]]:
    """pid -> (start ticks, node) of every live process in one of the namespaces ``ids``
    (the caller excepted)."""
    found: dict[int, tuple[int, str]] = {}
    me = os.getpid()
    for pid, proc in (process_table() if table is None else table).items():
        if pid == me:
            continue
        for kind in _NS_KINDS:
            try:
                st = os.stat(f"/proc/{pid}/ns/{kind}")
            except OSError:
                break
            node = ids.get((st.st_dev, st.st_ino))
            if node is not None:
                found[pid] = (proc.ticks, node)
                break
    return found


def destroy(plan: HostPlan, runner: CommandRunner) -> None:
    """Remove the plan's interfaces, namespaces, mounts and record; idempotent.

    Deleting a node's host-side veth deletes its peer at once (deleting only the
    netns would free it later, asynchronously). Raises if anything is left.
    """
    present = link_names(runner)
    for dev in (*(n.veth for n in plan.nodes), *(p.link[0] for p in plan.pools if p.link),
                *(p.bridge for p in plan.pools)):
        if dev in present:
            run_step(runner, Step(f"delete {dev}", ("ip", "link", "del", dev)))
    for ns in sorted({n.netns for n in plan.nodes} & netns_names(runner)):
        run_step(runner, Step(f"delete netns {ns}", ("ip", "netns", "delete", ns)))
    _unmount(runner, (f for n in plan.nodes for f in (n.mnt_file, n.uts_file)))
    _unmount(runner, [plan.ns_dir])
    left = _leftovers(plan, runner)
    if left:
        raise StateError(f"separate hosts: could not remove {', '.join(left)}")
    for n in plan.nodes:
        for f in (n.mnt_file, n.uts_file):
            f.unlink(missing_ok=True)
    plan.record.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        plan.ns_dir.rmdir()


def _unmount(runner: CommandRunner, paths: Iterable[Path]) -> None:
    for p in paths:
        for _ in range(8):  # a crashed up may have stacked the same bind twice
            if p not in mount_points():
                break
            run_step(runner, Step(f"unmount {p}", ("umount", str(p))))


def _leftovers(plan: HostPlan, runner: CommandRunner) -> list[str]:
    links = sorted(set(plan.interfaces()) & link_names(runner))
    nss = sorted({n.netns for n in plan.nodes} & netns_names(runner))
    mounted = mount_points()
    mounts = [str(f) for n in plan.nodes for f in (n.mnt_file, n.uts_file) if f in mounted]
    return ([f"interface {d}" for d in links] + [f"netns {n}" for n in nss]
            + [f"mount {m}" for m in mounts])
