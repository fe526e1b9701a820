"""``weave config check``: validate a site config or job specs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from weave_slurm.config.job import load_job
from weave_slurm.config.site import load_site
from weave_slurm.errors import ConfigError, WeaveError
from weave_slurm.model.profile import profile_job

config_app = typer.Typer(help="Validate configuration files.", no_args_is_help=True)


@config_app.command("check")
def check(
    site: Annotated[Path, typer.Argument(help="Site config TOML.")],
    jobs: Annotated[list[Path] | None, typer.Argument(help="Job specs to check "
                                                      "against this site.")] = None,
) -> None:
    """Validate SITE.toml (and optionally job specs against it); exit 2 on the first error."""
    try:
        cfg = load_site(site)
    except ConfigError as not_a_site:
        if not _is_job_spec(site):
            raise
        raise ConfigError(f"{site}: is a job spec, not a site config; usage: weave config "
                          "check SITE.toml [JOB.toml ...]") from not_a_site
    typer.echo(f"{site}: ok (rollout: {cfg.rollout.partition} {cfg.rollout.gpu.name} "
               f"x{cfg.rollout.gpus_per_node}, {cfg.rollout.max_nodes} nodes; train: "
               f"{cfg.train.partition} {cfg.train.gpu.name} x{cfg.train.gpus_per_node}, "
               f"{cfg.train.max_nodes} nodes)")
    for path in jobs or []:
        prof = profile_job(load_job(path), cfg)
        layout = f"; {prof.layout.words()}" if prof.layout is not None else ""
        typer.echo(f"{path}: ok (solo iteration {prof.solo_s:.0f} s, slo {prof.slo:g}"
                   f"{layout})")


def _is_job_spec(path: Path) -> bool:
    try:
        load_job(path)
    except WeaveError:
        return False
    return True
