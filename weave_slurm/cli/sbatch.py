"""``weave-sbatch``: submit a job spec (TOML) or a script with ``#WEAVE`` directives.

Like sbatch it prints ``Submitted weave job <id>`` (``--parsable``: the id alone).
The spec is validated here first (for a good message) and again, atomically, by
the daemon; a refused submission leaves nothing behind. Here, as the submitting user,
the job's ``workdir``, ``python`` and ``pythonpath`` must exist and be usable by you
(``--test-only`` checks that too); weaved checks them again as your uid, with its site
path roots, and the node interpreter when the job names no ``python``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from weave_slurm.cli.error_lines import entry
from weave_slurm.cli.version import version_option
from weave_slurm.daemon.access import check_access, output_needs, worker_needs
from weave_slurm.daemon.client import DaemonClient, default_socket
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.submission import build_spec, env_options, sbatch_flags, wrap_script
from weave_slurm.errors import ConfigError

# plain help as sbatch's (rich markup would turn "H:M:S" into an emoji)
app = typer.Typer(name="weave-sbatch", add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def submit(
    script: Annotated[str | None, typer.Argument(metavar="PATH",
        help="Job spec (.toml) or a script with #WEAVE lines (none: the script is read from "
        "standard input, as sbatch).")] = None,
    job_name: Annotated[str | None, typer.Option("--job-name", "-J", help="Job name.")] = None,
    account: Annotated[str | None, typer.Option("--account", "-A", help="Slurm account "
                                                "charged.")] = None,
    qos: Annotated[str | None, typer.Option("--qos", "-q", help="Slurm QOS.")] = None,
    time: Annotated[str | None, typer.Option("--time", "-t", help="Time limit (M, M:S, "
                                             "H:M:S, D-H, D-H:M, D-H:M:S).")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Output file "
                                               "(%j job id, %u user, %x name).")] = None,
    error: Annotated[str | None, typer.Option("--error", "-e", help="Error file.")] = None,
    dependency: Annotated[str | None, typer.Option(
        "--dependency", "-d", help="Start after other weave jobs: after|afterany|afterok|"
        "afternotok:ID[:ID...][,...].")] = None,
    array: Annotated[str | None, typer.Option(
        "--array", "-a", help="One job per element: a-b[:s][%n] or a list 1,3,5-7 (%n: at "
        "most n running at once).")] = None,
    hold: Annotated[bool, typer.Option("--hold", "-H", help="Submit held: PENDING until "
                                       "weave release ID.")] = False,
    container: Annotated[str | None, typer.Option(
        "--container", help="OCI bundle the job's processes run in (a directory with "
        "config.json and rootfs/).")] = None,
    slo: Annotated[float | None, typer.Option("--slo", help="Permitted slowdown.")] = None,
    rollout_gpus: Annotated[int | None, typer.Option("--rollout-gpus")] = None,
    train_gpus: Annotated[int | None, typer.Option("--train-gpus")] = None,
    engine_gpus: Annotated[int | None, typer.Option("--engine-gpus", help="GPUs per "
                                                    "rollout engine (tensor parallel).")] = None,
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
    workdir: Annotated[str | None, typer.Option("--chdir", "-D", "--workdir", help="The "
                                                "job's working directory (relative: to the "
                                                "current one).")] = None,
    wrap: Annotated[str | None, typer.Option("--wrap", help="Run this command as the job's "
                                             "own processes (a cooperative job; its other "
                                             "terms as flags).")] = None,
    python: Annotated[str | None, typer.Option("--python", help="The workers' "
                                               "interpreter (a venv's bin/python).")] = None,
    pythonpath: Annotated[list[str] | None, typer.Option(
        "--pythonpath", help="Import paths put first on the workers' sys.path "
        "(':'-separated; may repeat).")] = None,
    cooperative: Annotated[bool, typer.Option(
        "--cooperative", help="Run the script's body as the job's own processes, one per "
        "role (the phase gate: docs/job_api.md).")] = False,
    solo: Annotated[bool, typer.Option(
        "--solo", help="Run alone: no other job shares its group (compare its final "
        "weights with a grouped run's: weave compare).")] = False,
    parsable: Annotated[bool, typer.Option("--parsable", help="Print the job id only.")] = False,
    test_only: Annotated[bool, typer.Option("--test-only", help="Validate, do not "
                                            "submit.")] = False,
    socket_path: Annotated[Path | None, typer.Option("--socket", help="weaved's socket.")] = None,
    version: Annotated[bool, version_option()] = False,
) -> None:
    """Submit PATH to weaved (flags override SBATCH_* variables, which override #WEAVE
    and #SBATCH directives and the spec)."""
    path, text = _script(None if script is None else Path(script), wrap)
    given: dict[str, Any] = {
        **sbatch_flags(account=account, qos=qos, time=time, output=output, error=error,
                       dependency=dependency, array=array),
        "hold": hold or None,
        "container": None if container is None else os.path.abspath(container),
        "job-name": job_name, "slo": slo, "rollout-gpus": rollout_gpus,
        "train-gpus": train_gpus, "engine-gpus": engine_gpus, "max-tokens": max_tokens,
        "prompts-per-step": prompts_per_step, "samples-per-prompt": samples_per_prompt,
        "model-params-b": model_params_b, "algorithm": algorithm, "entry": entry_point,
        "iterations": iterations, "seed": seed, "staleness": staleness,
        "rollout-s": rollout_s, "train-s": train_s, "rollout-state-gib": rollout_state_gib,
        "train-state-gib": train_state_gib, "workdir": workdir, "python": python,
        "pythonpath": _paths(pythonpath), "cooperative": cooperative or wrap is not None or None,
        "solo": solo or None}
    options = {**env_options(os.environ), **{k: v for k, v in given.items() if v is not None}}
    spec_text, spec = build_spec(path, options, os.environ,   # cooperative: your environment
                                 text)
    check_access(spec, worker_needs(spec, None) + output_needs(spec))   # as you: you run this
    with DaemonClient(default_socket(socket_path)) as client:   # weaved knows its site
        result = client.call(Op.SUBMIT, spec=spec_text, source=str(path), test_only=test_only)
    for warning in result.get("warnings") or ():   # an output file the nodes may not share
        typer.echo(f"weave-sbatch: warning: {warning}", err=True)
    if test_only:
        typer.echo(f"weave-sbatch: {path}: job {spec.name!r} would fit this site: "
                   f"{result['rollout_nodes']} rollout and {result['train_nodes']} training "
                   f"node(s), solo iteration {result['solo_iteration_s']:.0f} s, SLO "
                   f"{result['slo']:g} (not submitted)")
        return
    typer.echo(str(result["job"]) if parsable else f"Submitted weave job {result['job']}")


def _script(path: Path | None, wrap: str | None) -> tuple[Path, str | None]:
    """What is submitted: ``path``, else ``--wrap``'s command as a script (named ``wrap``,
    as sbatch names it), else a script piped on standard input (named ``sbatch``)."""
    if wrap is not None:
        if path is not None:
            raise ConfigError(f"--wrap: give the command or a script ({path}), not both")
        return Path("wrap"), wrap_script(wrap)
    if path is not None:
        return path, None
    text = ""
    if sys.stdin is not None and not sys.stdin.isatty():
        with contextlib.suppress(OSError):   # not readable (closed): no script there
            text = sys.stdin.read()
    if not text.strip():
        raise ConfigError("no job: give PATH (a spec or a script), pipe a script on "
                          "standard input, or give --wrap CMD")
    return Path("sbatch"), text


def _paths(values: list[str] | None) -> list[str] | None:
    """``--pythonpath`` given (maybe several times, each ':'-separated): the paths."""
    if not values:
        return None
    return [p for v in values for p in v.split(":") if p] or None


main = entry(app, "weave-sbatch")
