"""``weave config check``: validate a site config or job specs."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from weave_slurm.config.job import load_job
from weave_slurm.config.runtime import transfer_refusal
from weave_slurm.config.site import load_site
from weave_slurm.errors import ConfigError, WeaveError
from weave_slurm.model.profile import profile_job
from weave_slurm.slurm.templates import check_allocation_template
from weave_slurm.workloads.builtins import check_builtin, is_builtin

config_app = typer.Typer(help="Validate configuration files.", no_args_is_help=True)


class Backend(StrEnum):
    SLURM = "slurm"
    LOCAL = "local"


@config_app.command("check")
def check(
    site: Annotated[Path, typer.Argument(help="Site config TOML.")],
    jobs: Annotated[list[Path] | None, typer.Argument(help="Job specs to check "
                                                      "against this site.")] = None,
    backend: Annotated[Backend, typer.Option(
        help="Where weaved will run this site: slurm (its nodes are other hosts) or "
             "local (the embedded backend: every node on weaved's host).")]
    = Backend.SLURM,
) -> None:
    """Validate SITE.toml (and optionally job specs against it); exit 2 on the first error."""
    try:
        cfg = load_site(site)
    except ConfigError as not_a_site:
        if not _is_job_spec(site):
            raise
        raise ConfigError(f"{site}: is a job spec, not a site config; usage: weave config "
                          "check SITE.toml [JOB.toml ...]") from not_a_site
    if cfg.slurm.allocation_template is not None:
        check_allocation_template(cfg.slurm.allocation_template)
    refusal = transfer_refusal(cfg.runtime, remote_nodes=backend is Backend.SLURM)
    if refusal is not None:
        raise ConfigError(f"{site}: {refusal} (or check it with --backend local)")
    typer.echo(f"{site}: ok (rollout: {cfg.rollout.partition} {cfg.rollout.gpu.name} "
               f"x{cfg.rollout.gpus_per_node}, {cfg.rollout.max_nodes} nodes; train: "
               f"{cfg.train.partition} {cfg.train.gpu.name} x{cfg.train.gpus_per_node}, "
               f"{cfg.train.max_nodes} nodes)")
    for path in jobs or []:
        job = load_job(path)
        prof = profile_job(job, cfg)
        if job.entry is not None and is_builtin(job.entry) and prof.layout is not None:
            check_builtin(job, prof.layout, installed=False)
        layout = f"; {prof.layout.words()}" if prof.layout is not None else ""
        runs = "" if job.entry is not None or job.launch is not None else \
            "; planning-only: no entry"
        typer.echo(f"{path}: ok (solo iteration {prof.solo_s:.0f} s, slo {prof.slo:g}"
                   f"{layout}{runs})")


def _is_job_spec(path: Path) -> bool:
    try:
        load_job(path)
    except WeaveError:
        return False
    return True
