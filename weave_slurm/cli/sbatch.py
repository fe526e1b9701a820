"""``weave-sbatch``: submit a job spec to the meta-scheduler (the daemon lands with issue 4).

Until the daemon exists this validates the spec against the site and prints the
profile placement would use, then says plainly that nothing was submitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from weave_slurm.cli.errors import entry
from weave_slurm.cli.plan import load_site_or_default
from weave_slurm.config.job import load_job
from weave_slurm.errors import WeaveError
from weave_slurm.model.profile import profile_job

app = typer.Typer(name="weave-sbatch", add_completion=False, pretty_exceptions_enable=False)


class NoDaemon(WeaveError):
    exit_code = 1


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="Job spec TOML.")],
    site: Annotated[Path | None, typer.Option("--site", help="Site config TOML.")] = None,
) -> None:
    """Validate SPEC against the site; submission needs the weaved daemon."""
    prof = profile_job(load_job(spec), load_site_or_default(site))
    typer.echo(f"{spec}: valid; solo iteration {prof.solo_s:.0f} s, slo {prof.slo:g}, "
               f"{prof.rollout_nodes} rollout + {prof.train_nodes} training node(s)")
    raise NoDaemon("no weaved daemon to submit to yet: nothing was submitted")


main = entry(app, "weave-sbatch")
