"""Turning exceptions into one line and an exit code, at the CLI boundary only.

typer 0.29 carries its own copy of click (``typer._click``) and does not depend on
``click``: its usage errors are ``typer._click`` classes, caught here from there, and
``click`` is never imported. A usage mistake is one line, Slurm-style, exit code 2::

    weave status: error: unrecognized option '-t'; valid: --user, -u, ...
    weave daemon: error: invalid value 'bogus' for '--runtime'; valid: auto, rl, idle

A :class:`~weave_slurm.errors.WeaveError` is ``prog: error: message`` and its exit code.
Logging is not configured here: each command that logs calls
:func:`weave_slurm.cli.logs.setup_logging` once, after its flags are parsed.
"""

from __future__ import annotations

import enum
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

import typer
from typer._click.core import Context, Parameter
from typer._click.exceptions import (
    BadParameter,
    ClickException,
    MissingParameter,
    NoArgsIsHelpError,
    NoSuchOption,
    UsageError,
)
from typer.core import TyperArgument, TyperGroup, TyperOption

from weave_slurm.errors import WeaveError

#: Exit code of a usage mistake (bad flag, bad value, missing argument), like click's.
USAGE_EXIT = 2


def run_app(app: typer.Typer, prog: str, argv: list[str] | None = None) -> int:
    """Run a typer app; return its exit code, every error turned into one line."""
    try:
        code = app(args=argv, prog_name=prog, standalone_mode=False)
    except WeaveError as exc:
        _say(f"{prog}: error: {exc}")
        return exc.exit_code
    except NoArgsIsHelpError as exc:   # nothing given where a command is needed: the help
        exc.show()
        return exc.exit_code
    except UsageError as exc:
        _say(usage_line(prog, exc))
        return USAGE_EXIT
    except ClickException as exc:
        _say(f"{prog}: error: {_flat(exc.format_message())}")
        return exc.exit_code
    except typer.Abort:
        _say(f"{prog}: aborted")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    # standalone_mode=False returns typer.Exit's code (or the command's value: None)
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def entry(app: typer.Typer, prog: str) -> Callable[[], None]:
    """The console-script function of ``prog``."""
    def main() -> None:
        sys.exit(run_app(app, prog))

    return main


def usage_line(prog: str, exc: UsageError) -> str:
    """One line naming the command, the flag or argument, the bad value and the choices."""
    ctx = exc.ctx
    where = ctx.command_path if ctx is not None else prog
    if isinstance(exc, NoSuchOption):
        what = f"unrecognized option {exc.option_name!r}"
        valid = _options(ctx) if ctx is not None else []
        return f"{where}: error: {what}; valid: {', '.join(valid)}" if valid else \
            f"{where}: error: {what}"
    if isinstance(exc, MissingParameter):
        kind = exc.param.param_type_name if exc.param is not None else "parameter"
        return f"{where}: error: missing {kind} {_hint(exc.param)}; see '{where} --help'"
    if isinstance(exc, BadParameter):
        return f"{where}: error: {_bad_value(exc)}"
    text = _lower(_flat(exc.format_message()))
    if ctx is not None and isinstance(ctx.command, TyperGroup):
        return f"{where}: error: {text}; valid: {', '.join(ctx.command.list_commands(ctx))}"
    return f"{where}: error: {text}; see '{where} --help'"


def _bad_value(exc: BadParameter) -> str:
    param = exc.param
    hint = _hint(param)
    value = _input_value(exc)
    head = f"invalid value for {hint}" if value is None else \
        f"invalid value {value!r} for {hint}"
    choices = _choices(param)
    if choices:
        return f"{head}; valid: {', '.join(choices)}"
    message = _lower(_flat(exc.message)).removeprefix("value error, ")
    return f"{head}: {message}" if message else head


def _hint(param: Parameter | None) -> str:
    """How the help names it: ``JOB_IDS`` for an argument, ``'--runtime'`` for an option."""
    if param is None:
        return "a parameter"
    if isinstance(param, TyperArgument):
        return (param.name or "argument").upper()
    if isinstance(param, TyperOption):
        return str(param.get_error_hint())
    return repr(param.name)


def _input_value(exc: BadParameter) -> object | None:
    """The value the user gave: typer validates with pydantic, whose error carries it."""
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    if not callable(errors):
        return None
    try:
        first = errors()[0]
    except (IndexError, TypeError):
        return None
    return first.get("input") if isinstance(first, dict) else None


def _choices(param: Any) -> list[str]:
    """An enum-typed flag's valid values (``Optional`` and ``list`` unwrapped)."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    while typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else None
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(m.value) for m in annotation]
    return []


def _options(ctx: Context) -> list[str]:
    return [opt for p in ctx.command.get_params(ctx)
            if isinstance(p, TyperOption) and not p.hidden
            for opt in (*p.opts, *p.secondary_opts)]


def _flat(text: str) -> str:
    """One line, without a final full stop (it is followed by '; ...')."""
    lines = (line.strip() for line in text.strip().splitlines())
    return "; ".join(line for line in lines if line).rstrip(".")


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]


def _say(line: str) -> None:
    print(line, file=sys.stderr)
