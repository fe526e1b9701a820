"""Usage mistakes are one line and exit 2; a WeaveError is one line and its exit code;
``--version`` answers; and the CLIs work where ``click`` cannot be imported (typer 0.29
carries its own copy, and a wheel installs nothing else)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import typer

from weave_slurm.cli.error_lines import USAGE_EXIT, run_app
from weave_slurm.cli.main import app as weave_app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.errors import ConfigError, InsufficientResources

#: argv -> words the one line must hold (the option or argument, the bad value, choices)
MISTAKES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("status", "--bogus", "RUNNING"): ("weave status: error:", "'--bogus'", "valid:",
                                       "--user", "--states"),
    ("status", "-t", "RUNING"): ("weave: error:", "--states", "'RUNING'",
                                 "valid:", "RUNNING (R)", "all"),
    ("status", "-S", "-Z"): ("weave: error:", "--sort", "'-Z'", "valid:"),
    ("cancel",): ("weave: error:", "no job id and no filter", "-u", "-n", "-t"),
    ("show", "job"): ("weave show: error:", "missing argument IDENT"),
    ("cancel", "abc"): ("weave cancel: error:", "'abc' is not a job id", "integer ID",
                        "ID_TASK"),
    ("daemon", "--runtime", "bogus"): ("weave daemon: error:", "'bogus'", "'--runtime'",
                                       "valid: auto, rl, idle"),
    ("--bogus",): ("weave: error:", "'--bogus'", "--version"),
    ("nope",): ("weave: error:", "'nope'", "valid:", "status", "daemon"),
    ("plan", "--max-group-size", "0", "x.toml"): ("'0'", "'--max-group-size'",
                                                   "greater than or equal to 1"),
    ("node", "serve"): ("weave node serve: error:", "missing option '--host-mem-gib'"),
    ("status", "--format"): ("'--format' requires an argument",),
}


def _one_line(text: str) -> str:
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("argv", sorted(MISTAKES), ids=" ".join)
def test_a_usage_mistake_is_one_line_and_exit_2(argv: tuple[str, ...],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(weave_app, "weave", list(argv)) == USAGE_EXIT == 2
    out = capsys.readouterr()
    line = _one_line(out.err)
    for word in MISTAKES[argv]:
        assert word in line, line
    assert out.out == ""


@pytest.mark.parametrize("argv", [["--bogus", "x.toml"], []], ids=["option", "missing"])
def test_weave_sbatch_usage_mistakes(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(sbatch_app, "weave-sbatch", argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("weave-sbatch: error: ")
    assert ("'--bogus'" in line and "--job-name" in line) if argv else "PATH" in line


@pytest.mark.parametrize(("application", "prog"), [(weave_app, "weave"),
                                                   (sbatch_app, "weave-sbatch")])
@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_package_version(application: typer.Typer, prog: str, flag: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(application, prog, [flag]) == 0
    assert capsys.readouterr().out == f"weave-slurm {version('weave-slurm')}\n"


def _failing_app(exc: Exception) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def fail() -> None:
        raise exc

    return app


@pytest.mark.parametrize(("exc", "code"), [
    (ConfigError("--site 'x.toml': cannot read"), 2),
    (InsufficientResources("no h20 node free; retry later"), 1),
    (typer.Exit(3), 3),
])
def test_an_error_is_one_line_and_its_exit_code(exc: Exception, code: int,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(_failing_app(exc), "weave", []) == code
    err = capsys.readouterr().err
    if isinstance(exc, typer.Exit):
        assert err == ""
    else:
        assert _one_line(err) == f"weave: error: {exc}"


#: Run an entry point where ``import click`` fails, as in a venv that has only typer 0.29.
NO_CLICK = ("import sys; sys.modules['click'] = None; sys.argv = [{prog!r}, *{argv!r}]; "
            "from weave_slurm.cli.{mod} import main; main()")


@pytest.mark.parametrize(("mod", "prog", "argv", "code"), [
    ("main", "weave", ["--help"], 0),
    ("main", "weave", ["daemon", "--help"], 0),
    ("main", "weave", ["status", "--bogus", "RUNNING"], 2),
    ("sbatch", "weave-sbatch", ["--help"], 0),
    ("sbatch", "weave-sbatch", ["--version"], 0),
])
def test_the_entry_points_never_import_click(mod: str, prog: str, argv: list[str],
                                             code: int) -> None:
    res = subprocess.run([sys.executable, "-c", NO_CLICK.format(prog=prog, argv=argv, mod=mod)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr and "click" not in res.stderr, res.stderr
    if code == 2:
        _one_line(res.stderr)


def test_weave_status_loads_only_what_it_needs(tmp_path: Path) -> None:
    """Subcommands are imported on use: ``weave status`` (the command users run most)
    loads neither torch nor the simulator, placement or the cluster tooling."""
    probe = ("import sys\n"
             "from weave_slurm.cli.error_lines import run_app\n"
             "from weave_slurm.cli.main import app\n"
             f"run_app(app, 'weave', ['status', '--socket', {str(tmp_path / 'none.sock')!r}])\n"
             "heavy = ('torch', 'weave_slurm.sim', 'weave_slurm.placement', "
             "'weave_slurm.slurm.local_cluster', 'weave_slurm.node')\n"
             "print(sorted({m.split('.')[0] if m == 'torch' else m for m in sys.modules "
             "if m.startswith(heavy)}))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out
