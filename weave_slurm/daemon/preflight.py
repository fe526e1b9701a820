"""``weave site check``: what weaved needs of its site, checked before it runs.

One :class:`Check` per line, each a fact weaved relies on (docs/deploy.md):

- the site config reads, and Slurm answers ``sinfo --json``;
- each pool's partition exists and has nodes whose GRES hold the site's GPUs (weaved
  asks ``--gres=gpu:<gpu>:<gpus_per_node>`` of whole nodes);
- munge makes a credential on this host and decodes it back (weaved's requests to
  the node daemons are munge-authenticated: ``node/auth.py``);
- the shared paths exist here: the checkpoint root (on Slurm there is no usable
  default) and every path root;
- the node interpreter, its standard library and the installed weave package can be
  used by an ordinary user, asked of the kernel as that user
  (:func:`weave_slurm.daemon.access.probe`, as weaved checks a submission): the
  workers of every job import from there as its user;
- the site's ``oci.conf`` (beside ``slurm.conf``) names an OCI runtime this host has, for
  jobs that name a container (none: skipped, such jobs are refused);
- the state dir is not on a network file system (SQLite must not live there);
- the API socket and the metrics port are free.
"""

from __future__ import annotations

import enum
import errno
import os
import pwd
import shutil
import socket
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.config.oci import read_oci_conf, runtime_argv
from weave_slurm.config.runtime import transfer_refusal
from weave_slurm.config.site import PoolConfig, SiteConfig
from weave_slurm.daemon.access import Kind, Need, probe
from weave_slurm.errors import WeaveError
from weave_slurm.node.zygotes import weave_package_dir
from weave_slurm.slurm.accounting import Accounting
from weave_slurm.slurm.backend import NodeInfo

#: File systems SQLite's locking cannot trust (the state dir must not be on one).
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs",
              "glusterfs", "ceph", "fuse.sshfs")


class Status(enum.Enum):
    OK = "ok"
    FAIL = "FAIL"
    SKIP = "skip"      # could not be checked here (said why)


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str

    def line(self) -> str:
        return f"{self.status.value:<4} {self.name}: {self.detail}"


@dataclass(frozen=True)
class SiteFacts:
    """What to check: the daemon's flags as ``weave daemon`` takes them."""

    site: SiteConfig
    state_dir: Path
    socket: Path
    checkpoint_root: Path | None
    path_roots: tuple[Path, ...]
    node_python: str
    user: str                          # the ordinary user the interpreter is checked as
    munge_socket: str | None
    metrics: tuple[str, int] | None    # (address, port)
    oci_conf: Path | None = None       # the site's oci.conf (None: not checked)


def run_checks(facts: SiteFacts, nodes: Callable[[], Sequence[NodeInfo]],
               accounting: Callable[[], Accounting] | None = None) -> list[Check]:
    """Every check, in order (``nodes``: the backend's ``sinfo --json``;
    ``accounting``: a read of Slurm's, checked with ``[limits] from_slurm``)."""
    out = pools(facts.site, nodes)
    if facts.site.limits.from_slurm and accounting is not None:
        out.append(slurm_accounting(accounting))
    out.append(transfer(facts.site))
    out.append(munge(facts.munge_socket))
    out += shared_paths(facts.checkpoint_root, facts.path_roots)
    out.append(interpreter(facts.node_python, facts.user))
    if facts.oci_conf is not None:
        out.append(containers(facts.oci_conf))
    out.append(state_dir(facts.state_dir))
    out.append(api_socket(facts.socket))
    if facts.metrics is not None:
        out.append(port_free(*facts.metrics))
    return out


# -- Slurm ------------------------------------------------------------------------------

def pools(site: SiteConfig, nodes: Callable[[], Sequence[NodeInfo]]) -> list[Check]:
    try:
        listed = list(nodes())
    except WeaveError as exc:
        return [Check("slurm", Status.FAIL, f"sinfo --json failed: {exc}")]
    return [pool(p, listed) for p in (site.rollout, site.train)]


def slurm_accounting(read: Callable[[], Accounting]) -> Check:
    """weaved can read the associations and QOS it is to hold users to."""
    name = "slurm accounting (limits.from_slurm)"
    try:
        acct = read()
    except WeaveError as exc:
        return Check(name, Status.FAIL, f"sacctmgr failed: {exc}")
    users = sum(user is not None for _, user in acct.associations)
    return Check(name, Status.OK, f"cluster {acct.cluster}: {users} user associations, "
                                  f"{len(acct.qos)} QOS")


def transfer(site: SiteConfig) -> Check:
    """The weight transfer works across hosts (weaved on Slurm: its nodes are others)."""
    name = f"weight transfer {site.runtime.weight_transfer.value}"
    why = transfer_refusal(site.runtime, remote_nodes=True)
    return Check(name, Status.OK, "works across hosts") if why is None else \
        Check(name, Status.FAIL, f"{site.source}: {why}")


def pool(p: PoolConfig, nodes: Sequence[NodeInfo]) -> Check:
    name = f"partition {p.partition} ({p.role.value})"
    members = [n for n in nodes if p.partition in n.partitions]
    if not members:
        known = ", ".join(sorted({part for n in nodes for part in n.partitions})) or "none"
        return Check(name, Status.FAIL, f"not in sinfo (partitions: {known}); set "
                                        "[pools.*] partition")
    want = f"gpu:{p.gpu.name}:{p.gpus_per_node}"
    short = [f"{n.name} (gpu:{n.gpu_type or '?'}:{n.gpu_count})" for n in members
             if n.gpu_type != p.gpu.name or n.gpu_count < p.gpus_per_node]
    if short:
        return Check(name, Status.FAIL, f"nodes without GRES {want}: {', '.join(short)}; "
                                        "set gres.conf/slurm.conf, or the site's gpu and "
                                        "gpus_per_node")
    states = sorted({n.state.lower() for n in members})
    return Check(name, Status.OK, f"{len(members)} node(s) with GRES {want} "
                                  f"({', '.join(states)})")


# -- munge ------------------------------------------------------------------------------

def munge(sock: str | None) -> Check:
    from weave_slurm.node.auth import Munge

    name = f"munge{f' ({sock})' if sock else ''}"
    payload = os.urandom(16).hex().encode()
    try:
        m = Munge(sock)
        cred = m.decode(m.encode(payload))
    except WeaveError as exc:
        return Check(name, Status.FAIL, f"{exc}; is munged running with the site's key?")
    if cred.payload != payload or cred.uid != os.geteuid():
        return Check(name, Status.FAIL, f"a credential came back changed (uid {cred.uid})")
    return Check(name, Status.OK, f"a credential made and decoded as uid {cred.uid}")


# -- paths ------------------------------------------------------------------------------

def shared_paths(checkpoint_root: Path | None, path_roots: Sequence[Path]) -> list[Check]:
    if checkpoint_root is None:
        out = [Check("checkpoint root", Status.FAIL, "not given: the default "
                     "<state-dir>/ckpt is not shared with the nodes; give "
                     "--checkpoint-root on a file system they all mount")]
    else:
        out = [_dir("checkpoint root", checkpoint_root)]
    return out + [_dir("path root", p) for p in path_roots]


def _dir(what: str, path: Path) -> Check:
    name = f"{what} {path}"
    if not path.is_absolute():
        return Check(name, Status.FAIL, "not absolute: the nodes resolve it elsewhere")
    if not path.is_dir():
        return Check(name, Status.FAIL, "is not a directory here")
    return Check(name, Status.OK, "a directory here (every node must mount it at this "
                                  "path)")


def interpreter(python: str, user: str) -> Check:
    name = f"node interpreter {python}"
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return Check(name, Status.FAIL, f"--as-user {user!r} is not a user here")
    needs = [Need("the interpreter", python, Kind.PROGRAM),
             Need("its standard library", sysconfig.get_path("stdlib"), Kind.DIR),
             Need("weave's installed package", weave_package_dir(), Kind.DIR)]
    found = probe(needs, uid)
    if found is None:
        return Check(name, Status.SKIP, f"only root can check as {user} (run as root)")
    bad = [f"{n.key} {n.path} ({_why(code)})" for n, code in zip(needs, found, strict=True)
           if code != 0]
    if bad:
        return Check(name, Status.FAIL, f"{user} cannot use {'; '.join(bad)}: jobs' "
                     "workers would fail to import; make it readable by users (o+rx)")
    return Check(name, Status.OK, f"{user} can run it and read its library and weave")


def _why(code: int) -> str:
    return {-1: "not a file", -2: "not a directory",
            errno.ETIMEDOUT: "timed out"}.get(code, os.strerror(code))


def containers(path: Path) -> Check:
    """The OCI runtime of ``oci.conf``, for jobs naming a container (docs/deploy.md)."""
    try:
        conf = read_oci_conf(path)
    except WeaveError as exc:
        return Check("containers", Status.FAIL, str(exc))
    if conf is None:
        return Check("containers", Status.SKIP, f"no {path}: a job naming a container is "
                     "refused (docs/deploy.md, 'Containers')")
    why = conf.problem()
    if why is not None:
        return Check("containers", Status.FAIL, why)
    program = runtime_argv(conf.run or "", {})[0]
    if shutil.which(program) is None:
        return Check("containers", Status.FAIL, f"{path}: RunTimeRun's {program!r} is not "
                     "installed here (every node needs it: apt-get install runc)")
    return Check("containers", Status.OK, f"{path}: RunTimeRun runs {program} (every node "
                 "needs it and this file)")


def state_dir(path: Path) -> Check:
    name = f"state dir {path}"
    fs = fs_type(path)
    if fs in NETWORK_FS:
        return Check(name, Status.FAIL, f"on {fs}: SQLite must not live on a network file "
                                        "system; use a local disk")
    return Check(name, Status.OK, f"on {fs or 'an unknown file system'} (local)")


def fs_type(path: Path) -> str | None:
    """The type of the file system holding ``path`` (its nearest existing ancestor)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        return None
    return kind


# -- ports ------------------------------------------------------------------------------

def api_socket(path: Path) -> Check:
    name = f"api socket {path}"
    if not path.exists():
        return Check(name, Status.OK, "free")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        try:
            s.connect(str(path))
        except OSError:
            return Check(name, Status.OK, "free (a stale socket file: weaved replaces it)")
    return Check(name, Status.FAIL, "a weaved serves it already: stop it, or give another "
                                    "--state-dir/--socket")


def port_free(addr: str, port: int) -> Check:
    name = f"metrics port {addr}:{port}"
    try:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as weaved binds it
            s.bind((addr, port))
    except OSError as exc:
        return Check(name, Status.FAIL, f"cannot listen there ({exc.strerror or exc})")
    return Check(name, Status.OK, "free")
