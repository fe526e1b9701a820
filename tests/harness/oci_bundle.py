"""The test container: an OCI bundle whose rootfs is Debian's, built from packages.

No image registry is reachable from CI; Debian's package mirror is. :func:`cached_rootfs`
builds the smallest rootfs that runs a job's processes (``mmdebstrap --variant=essential``
with ``python3.11`` and ``libstdc++6``, which torch's wheel needs: ~194 MB; 22-63 s on
this kind of machine, network and load permitting), once per machine, under
:data:`CACHE` (outside any cluster's state dir, so every separate host sees it), with a
file only the rootfs holds (:data:`MARKER`). :func:`make_bundle` makes a bundle of it
where a test wants one: ``rootfs/`` as hard links (a fraction of a second),
``config.json`` from the runtime's own ``spec``, without a network namespace (the job's
processes talk between nodes, as in HPC images), with a read-only root and a tmpfs
``/tmp`` (Python's tempfile, which torch imports, needs a writable one).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from filelock import FileLock

from weave_slurm.slurm.command_runner import run_command
from weave_slurm.slurm.local_cluster import oci_runtime

CACHE = Path("/var/cache/weave-slurm/oci")
ROOTFS = CACHE / "bookworm-python3.11-libstdc++6" / "rootfs"
PACKAGES = "python3.11,libstdc++6"
MIRROR = "http://deb.debian.org/debian"
#: A file only the test rootfs has, and what it says.
MARKER = Path("/etc/weave-container-marker")
MARKER_TEXT = "inside the weave test container"
BUILD_TIMEOUT_S = 600


def cached_rootfs() -> Path:
    """The test rootfs, built on first use (skips the test where it cannot be built)."""
    if (ROOTFS / MARKER.relative_to("/")).is_file():
        return ROOTFS
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap not installed (make system installs it)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / ".build.lock")):
        if not (ROOTFS / MARKER.relative_to("/")).is_file():
            tmp = ROOTFS.with_name("rootfs.building")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            run_command(["mmdebstrap", "--quiet", "--variant=essential", f"--include={PACKAGES}",
                         "--mode=root", "bookworm", str(tmp), MIRROR], timeout_s=BUILD_TIMEOUT_S)
            (tmp / MARKER.relative_to("/")).write_text(MARKER_TEXT + "\n")
            (tmp.parent / "built.json").write_text(json.dumps(
                {"seconds": round(time.monotonic() - start, 1)}) + "\n")
            tmp.rename(ROOTFS)
    return ROOTFS


def make_bundle(dest: Path) -> Path:
    """An OCI bundle at ``dest`` (config.json and rootfs/) of the cached rootfs."""
    runtime = oci_runtime()
    if runtime is None:
        pytest.skip("no OCI runtime (runc, crun) installed (make system installs runc)")
    rootfs = cached_rootfs()
    dest.mkdir(parents=True)
    run_command(["cp", "-al", str(rootfs), str(dest / "rootfs")], timeout_s=120)
    run_command([runtime, "spec", "--bundle", str(dest)], timeout_s=30)
    config = json.loads((dest / "config.json").read_text())
    config["root"] = {"path": "rootfs", "readonly": True}
    config["process"]["terminal"] = False
    spaces = config["linux"]["namespaces"]
    config["linux"]["namespaces"] = [n for n in spaces if n["type"] != "network"]
    config["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                             "options": ["nosuid", "nodev", "mode=1777"]})
    (dest / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return dest
