"""A user's own code for the tests: a job package outside the repository (not on this
process's path) and a second Python environment that has torch but not weave."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

#: ``my_pkg/job.py``: the reference GRPO job under the user's own name. ``make`` (a
#: zero-argument factory, as workloads/entry.py wants) records where the worker ran.
JOB_MODULE = '''
import json, os, socket, sys

from weave_slurm.workloads.grpo_toy import GrpoToyJob


def make():
    seen = {"executable": sys.executable, "prefix": sys.prefix, "cwd": os.getcwd(),
            "path0": sys.path[0], "uid": os.getuid(), "module": __file__,
            "host": socket.gethostname()}
    with open(os.path.join(os.getcwd(), f"seen-{os.getpid()}.json"), "w") as f:
        json.dump(seen, f)
    return GrpoToyJob()
'''


def user_package(root: Path) -> Path:
    """``<root>/src/my_pkg`` (readable by every uid); returns ``<root>/src``."""
    pkg = root / "src" / "my_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text(JOB_MODULE)
    for path in (root, root / "src", pkg):
        path.chmod(0o755)
    for path in pkg.iterdir():
        path.chmod(0o644)
    return root / "src"


def seen(workdir: Path) -> list[dict[str, object]]:
    """What ``make`` recorded, once per worker that built the job there."""
    import json

    return [json.loads(p.read_text()) for p in sorted(workdir.glob("seen-*.json"))]


def base_python() -> str:
    """An interpreter of this Python version that every uid can run: the system's
    (``/usr/bin/python3.X``) when there is one, else this environment's base."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = Path("/usr/bin") / version
    if system.exists() and os.access(system, os.X_OK):
        return str(system)
    return str(Path(sys.base_prefix) / "bin" / version)


def second_venv(parent: Path, *, with_torch: bool = True) -> Path:
    """A venv in ``parent`` (readable by every uid); with torch, it sees this
    environment's ``site-packages`` through a ``.pth`` line (so no install), which
    does not run the ``.pth`` files there: weave itself (installed editable) is not
    importable in it. Returns its ``bin/python``."""
    venv = parent / "venv"
    subprocess.run([base_python(), "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True)
    if with_torch:
        site = next(venv.glob("lib/python*/site-packages"))
        (site / "weave-test-env.pth").write_text(f"{Path(torch.__file__).parents[1]}\n")
    for path in (parent, *venv.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return venv / "bin" / "python"


def imports_weave(python: Path) -> bool:
    """Whether ``python``, started in ``/`` with a clean environment, imports weave."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([str(python), "-c", "import weave_slurm"], cwd="/", env=env,
                          capture_output=True)
    return done.returncode == 0
