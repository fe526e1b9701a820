"""Containers: the site's ``oci.conf`` and a job's OCI bundle (``[slurm] container``).

A job may name an OCI bundle (a directory with ``config.json`` and its ``rootfs``, as
``srun --container=BUNDLE`` takes it); its processes then run inside it through the
site's OCI runtime, as Slurm's own OCI support runs a step's tasks. The runtime is the
one the site configured for Slurm: ``oci.conf`` beside ``slurm.conf`` (Slurm 22.05's
``RunTimeRun``, ``RunTimeQuery``, ``RunTimeKill``, ``RunTimeDelete``; Slurm reads no
other place). :func:`read_oci_conf` reads it; :func:`runtime_argv` fills a pattern in as
Slurm does (``%b`` bundle, ``%r`` rootfs, ``%n`` node, ``%u`` user, ``%U`` uid, ``%j``
job, ``%s`` step, ``%t`` task, ``%%``); :func:`container_refusal` is the submission's
check (one line each: no such bundle, no ``config.json``, no ``rootfs``, no runtime),
:func:`check_container` the submission's call.

Slurm 22.05 runs a bundle's ``<bundle>/rootfs`` whatever its ``root.path`` says (seen on
the test cluster: an absolute ``root.path`` elsewhere gave runc "stat
<bundle>/rootfs: no such file", a symlink there "not an absolute path, or a
symlink"), so a bundle must hold its rootfs there, a directory, for both paths.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.config.job import JobSpec
from weave_slurm.errors import ConfigError

#: Slurm's default configuration file, when ``SLURM_CONF`` is not set.
DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")


@dataclass(frozen=True)
class OciConf:
    """The parts of ``oci.conf`` weave uses (keys lower-cased, values as written)."""

    path: Path
    values: Mapping[str, str]

    @property
    def run(self) -> str | None:
        return self.values.get("runtimerun")

    @property
    def delete(self) -> str | None:
        return self.values.get("runtimedelete")

    def problem(self) -> str | None:
        """Why weave cannot run containers with it (None: it can)."""
        if self.run is None:
            if "runtimecreate" in self.values:
                return (f"{self.path} configures RunTimeCreate/RunTimeStart; weave runs a "
                        "container with RunTimeRun (set RunTimeRun, docs/deploy.md)")
            return f"{self.path} configures no OCI runtime (no RunTimeRun; docs/deploy.md)"
        return None


def oci_conf_path(environ: Mapping[str, str] | None = None) -> Path:
    """``oci.conf`` beside the ``slurm.conf`` Slurm's clients read (``SLURM_CONF``)."""
    env = os.environ if environ is None else environ
    return Path(env.get("SLURM_CONF") or DEFAULT_SLURM_CONF).parent / "oci.conf"


def parse_oci_conf(text: str, path: Path) -> OciConf:
    """``Key=value`` lines (keys case-insensitive, ``#`` comments, values may be quoted)."""
    values: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = _uncommented(raw).strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"{path}:{n}: expected Key=value, got {raw.strip()!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        values[key.strip().lower()] = value
    return OciConf(path, values)


def _uncommented(line: str) -> str:
    """``line`` up to its first ``#`` outside double quotes."""
    quoted = False
    for i, ch in enumerate(line):
        if ch == '"':
            quoted = not quoted
        elif ch == "#" and not quoted:
            return line[:i]
    return line


def read_oci_conf(path: Path | None = None) -> OciConf | None:
    """The site's ``oci.conf`` (None: there is none)."""
    where = oci_conf_path() if path is None else path
    try:
        text = where.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    return parse_oci_conf(text, where)


def runtime_argv(pattern: str, values: Mapping[str, str]) -> list[str]:
    """``pattern`` split as a shell would, each ``%x`` replaced from ``values`` (keyed by
    the letter); an unknown ``%x`` is left as written."""
    def fill(word: str) -> str:
        out, i = [], 0
        while i < len(word):
            if word[i] == "%" and i + 1 < len(word):
                code = word[i + 1]
                out.append("%" if code == "%" else values.get(code, word[i:i + 2]))
                i += 2
            else:
                out.append(word[i])
                i += 1
        return "".join(out)
    return [fill(w) for w in shlex.split(pattern)]


def bundle_problem(bundle: str) -> str | None:
    """Why ``bundle`` is no OCI bundle weave (and Slurm) can run (None: it is one)."""
    if not os.path.isabs(bundle):
        return "must be an absolute path to an OCI bundle (a directory with config.json)"
    path = Path(bundle)
    if not path.is_dir():
        return "no such directory (an OCI bundle: config.json and rootfs/)"
    if not (path / "config.json").is_file():
        return "has no config.json (an OCI bundle: config.json and rootfs/; runc spec writes one)"
    rootfs = path / "rootfs"
    if rootfs.is_symlink() or not rootfs.is_dir():
        return ("has no rootfs/ directory (Slurm runs <bundle>/rootfs; a symlink is "
                "refused by the runtime)")
    return None


def container_refusal(bundle: str, conf: OciConf | None, conf_path: Path) -> str | None:
    """The submission's one-line reason a job's container cannot run here, or None."""
    why = bundle_problem(bundle)
    if why:
        return f"key 'slurm.container' = {bundle!r}: {why}"
    if conf is None:
        return (f"key 'slurm.container' = {bundle!r}: this site has no OCI runtime configured "
                f"({conf_path} does not exist; docs/deploy.md, 'Containers')")
    why = conf.problem()
    return None if why is None else f"key 'slurm.container' = {bundle!r}: {why}"


def check_container(job: JobSpec, conf_path: Path, where: str) -> None:
    """ConfigError (one line) when the job names a container that cannot run here: no
    bundle, no ``config.json`` or ``rootfs/``, no OCI runtime in the site's ``oci.conf``."""
    bundle = job.slurm.container
    if bundle is None:
        return
    why = container_refusal(bundle, read_oci_conf(conf_path), conf_path)
    if why:
        raise ConfigError(f"{where}: {why}")
