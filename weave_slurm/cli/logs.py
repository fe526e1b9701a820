"""Logging is configured here, and only by entry points (style rule 8).

A command that logs calls :func:`setup_logging` once, after typer parsed its flags
(``weave daemon --verbose`` decides its level only then). Library modules use
``logging.getLogger(__name__)`` and never configure logging. Commands that do not
call it leave logging unconfigured: Python's last-resort handler writes WARNING and
above to stderr.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from weave_slurm.errors import ConfigError

_HANDLER_NAME = "weave-cli"


def setup_logging(level: int, prog: str, *, timestamps: bool = False,
                  to: logging.Handler | None = None) -> logging.Handler:
    """Send records at ``level`` and above to stderr (or to ``to``: :func:`file_handler`)
    as ``[time] prog LEVEL name: message``.

    Installs one handler on the root logger; a handler installed by an earlier
    call (a test that runs two commands in one process) is replaced, handlers of others
    (pytest's) are left alone.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    handler = to or logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    stamp = "%(asctime)s " if timestamps else ""
    handler.setFormatter(logging.Formatter(
        f"{stamp}{prog.replace('%', '%%')} %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def file_handler(path: Path, max_mib: float, backups: int) -> logging.Handler:
    """A log file (mode 0640 when created): rotated by size (``max_mib`` MiB, keeping
    ``backups`` old files ``PATH.1`` ...), or with ``max_mib`` 0 left to logrotate
    (reopened when logrotate has moved it away: no ``copytruncate`` needed)."""
    if not max_mib >= 0:
        raise ConfigError(f"--log-max-mib {max_mib!r}: must be >= 0 (0: logrotate rotates)")
    if max_mib > 0 and backups < 1:
        raise ConfigError(f"--log-backups {backups!r}: must be >= 1 (old files kept)")
    import logging.handlers  # here: the commands that log only to stderr skip it

    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640))
        if max_mib == 0:
            return logging.handlers.WatchedFileHandler(path, encoding="utf-8")
        return logging.handlers.RotatingFileHandler(
            path, maxBytes=int(max_mib * 2**20), backupCount=backups, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--log-file {str(path)!r}: cannot write it "
                          f"({exc.strerror or exc})") from exc
