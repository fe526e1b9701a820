"""``weave-sbatch``: submit a job spec (TOML) or a script with ``#WEAVE`` directives.

Like sbatch it prints ``Submitted weave job <id>`` (``--parsable``: the id alone).
The spec is validated here first (for a good message) and again, atomically, by
the daemon; a refused submission leaves nothing behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from weave_slurm.cli.errors import entry
from weave_slurm.cli.version import version_option
from weave_slurm.daemon.client import DaemonClient, default_socket
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.submission import build_spec

app = typer.Typer(name="weave-sbatch", add_completion=False, pretty_exceptions_enable=False)


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def submit(
    path: Annotated[Path, typer.Argument(help="Job spec (.toml) or a script with #WEAVE lines.")],
    job_name: Annotated[str | None, typer.Option("--job-name", "-J", help="Job name.")] = None,
    slo: Annotated[float | None, typer.Option("--slo", help="Permitted slowdown.")] = None,
    rollout_gpus: Annotated[int | None, typer.Option("--rollout-gpus")] = None,
    train_gpus: Annotated[int | None, typer.Option("--train-gpus")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens")] = None,
    prompts_per_step: Annotated[int | None, typer.Option("--prompts-per-step")] = None,
    samples_per_prompt: Annotated[int | None, typer.Option("--samples-per-prompt")] = None,
    model_params_b: Annotated[float | None, typer.Option("--model-params-b")] = None,
    algorithm: Annotated[str | None, typer.Option("--algorithm")] = None,
    entry_point: Annotated[str | None, typer.Option("--entry")] = None,
    iterations: Annotated[int | None, typer.Option("--iterations", help="Training steps "
                                                   "to run.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="The entry point's seed.")] = None,
    staleness: Annotated[int | None, typer.Option("--staleness", help="Dependency window "
                                                  "k (0 = strictly on-policy).")] = None,
    rollout_s: Annotated[float | None, typer.Option("--rollout-s")] = None,
    train_s: Annotated[float | None, typer.Option("--train-s")] = None,
    rollout_state_gib: Annotated[float | None, typer.Option("--rollout-state-gib")] = None,
    train_state_gib: Annotated[float | None, typer.Option("--train-state-gib")] = None,
    parsable: Annotated[bool, typer.Option("--parsable", help="Print the job id only.")] = False,
    test_only: Annotated[bool, typer.Option("--test-only", help="Validate, do not "
                                            "submit.")] = False,
    socket_path: Annotated[Path | None, typer.Option("--socket", help="weaved's socket.")] = None,
    version: Annotated[bool, version_option()] = False,
) -> None:
    """Submit PATH to weaved (flags override #WEAVE directives and the spec)."""
    given: dict[str, Any] = {
        "job-name": job_name, "slo": slo, "rollout-gpus": rollout_gpus,
        "train-gpus": train_gpus, "max-tokens": max_tokens,
        "prompts-per-step": prompts_per_step, "samples-per-prompt": samples_per_prompt,
        "model-params-b": model_params_b, "algorithm": algorithm, "entry": entry_point,
        "iterations": iterations, "seed": seed, "staleness": staleness,
        "rollout-s": rollout_s, "train-s": train_s, "rollout-state-gib": rollout_state_gib,
        "train-state-gib": train_state_gib}
    spec_text, spec = build_spec(path, {k: v for k, v in given.items() if v is not None})
    if test_only:
        typer.echo(f"weave-sbatch: {path}: valid spec for job {spec.name!r} (not submitted)")
        return
    with DaemonClient(default_socket(socket_path)) as client:
        result = client.call(Op.SUBMIT, spec=spec_text, source=str(path))
    typer.echo(str(result["job"]) if parsable else f"Submitted weave job {result['job']}")


main = entry(app, "weave-sbatch")
