"""What the group runtime starts for a cooperative member: one process per role.

A pure value built by weaved from the job's ``[launch]`` table
(:mod:`weave_slurm.config.launch`), its own code keys and its ``[slurm]`` output and
error (:func:`weave_slurm.config.sbatch.log_path`: patterns filled in, a relative name
in the working directory, as sbatch's ``--output``): each role's shell line, the
environment, the working directory, the output files and the container its processes
run in (``[slurm] container``, node/containers.py).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from weave_slurm.config.job import JobSpec
from weave_slurm.config.launch import DEFAULT_OUTPUT, ROLES, LaunchSpec
from weave_slurm.config.sbatch import JobSlurm, log_path


@dataclass(frozen=True)
class LaunchPlan:
    """Each role's command and where it runs (see module doc)."""

    commands: tuple[tuple[str, str], ...]         # (role, shell line), training first
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None                    # None: the user's home on the node
    output: str | None = None                     # absolute; None: discarded
    error: str | None = None                      # absolute; None: with the output
    container: str | None = None                  # an OCI bundle (node/containers.py)

    @classmethod
    def build(cls, launch: LaunchSpec, slurm: JobSlurm, *, job_id: str, name: str,
              user: str, home: str, workdir: str | None,
              pythonpath: Sequence[str] = (), iterations: int | None = None) -> LaunchPlan:
        def place(pattern: str | None) -> str | None:
            if pattern is None:
                return None
            return log_path(pattern, job_id=job_id, user=user, job_name=name,
                            workdir=workdir or home, array_job=slurm.array_job,
                            array_task=slurm.array_task)

        env = dict(launch.env)
        if pythonpath:   # the spec's pythonpath first, then the environment's
            env["PYTHONPATH"] = ":".join([*pythonpath, *filter(None, [env.get("PYTHONPATH")])])
        env["WEAVE_JOB_NAME"] = name
        if iterations is not None:   # how many versions the train role must produce
            env["WEAVE_ITERATIONS"] = str(iterations)
        env.update(slurm.array_env())   # an array's element: SLURM_ARRAY_*
        if launch.object_store_gib:   # Ray's --object-store-memory takes bytes
            env["WEAVE_OBJECT_STORE_BYTES"] = str(int(launch.object_store_gib * 2**30))
        return cls(tuple((role, launch.command(role)) for role in ROLES),
                   tuple(sorted(env.items())), workdir,
                   place(slurm.output or DEFAULT_OUTPUT), place(slurm.error), slurm.container)

    def request(self, role: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The node daemon's ``launch`` arguments for ``role`` (``env``: weave's own
        variables of this launch, runtime/member_net.py)."""
        return {"action": "start", "role": role, "command": dict(self.commands)[role],
                "env": {**dict(self.env), **(env or {})}, "workdir": self.workdir,
                "output": self.output, "error": self.error,
                **({"container": self.container} if self.container else {})}


def plan_for(spec: JobSpec, job_id: str, uid: int | None) -> LaunchPlan | None:
    """A stored job's plan (None: a hosted job); its home from the passwd database."""
    if spec.launch is None:
        return None
    try:
        home = pwd.getpwuid(os.getuid() if uid is None else uid).pw_dir
    except KeyError:
        home = "/"
    return LaunchPlan.build(spec.launch, spec.slurm, job_id=job_id, name=spec.name, user=spec.user,
                            home=home, workdir=spec.workdir, pythonpath=spec.pythonpath,
                            iterations=spec.iterations)
