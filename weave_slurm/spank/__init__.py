"""The weave SPANK plugin's source (``weave.c`` + ``Makefile``), shipped as package data.

The one copy of the source lives here, so an installed wheel can build the plugin on a
Slurm host (``weave spank build --out DIR``) and the repository builds the same files
(``make spank``). The build is the Makefile's own gcc line, run through ``make``.
"""

from __future__ import annotations

import os
import shutil
from importlib.resources import files
from pathlib import Path

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.command_runner import run_command

#: Where Slurm's headers are by default (``<dir>/slurm/spank.h``, Debian: libslurm-dev).
DEFAULT_SLURM_INCLUDE = Path("/usr/include")
PLUGIN_NAME = "weave.so"


def source_dir() -> Path:
    """The directory that holds ``weave.c`` and its ``Makefile`` (inside the package)."""
    return Path(str(files(__name__)))


def build(out_dir: Path, slurm_include: Path = DEFAULT_SLURM_INCLUDE,
          timeout_s: float = 120.0) -> Path:
    """``make -C <source_dir> OUT=<out_dir>``; returns ``<out_dir>/weave.so``.

    ConfigError when ``make`` or ``slurm/spank.h`` is missing; SlurmCommandError (argv,
    exit code, stderr) when the compiler fails.
    """
    header = slurm_include / "slurm" / "spank.h"
    if not header.is_file():
        raise ConfigError(f"--slurm-include {str(slurm_include)!r}: {header} not found; "
                          "install Slurm's headers (Debian: libslurm-dev) or name their "
                          "directory")
    for tool in ("make", os.environ.get("CC") or "gcc"):
        if shutil.which(tool) is None:
            raise ConfigError(f"spank build: {tool!r} is not on PATH; install it (Debian: "
                              "apt-get install make gcc)")
    out = out_dir.resolve()
    run_command(["make", "-s", "-C", str(source_dir()), f"OUT={out}",
                 f"SLURM_INCLUDE={slurm_include.resolve()}"], timeout_s=timeout_s)
    return out / PLUGIN_NAME
