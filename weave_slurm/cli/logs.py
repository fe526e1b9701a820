"""Logging is configured here, and only by entry points (style rule 8).

A command that logs calls :func:`setup_logging` once, after typer parsed its flags
(``weave daemon --verbose`` decides its level only then). Library modules use
``logging.getLogger(__name__)`` and never configure logging. Commands that do not
call it leave logging unconfigured: Python's last-resort handler writes WARNING and
above to stderr.
"""

from __future__ import annotations

import logging
import sys

_HANDLER_NAME = "weave-cli"


def setup_logging(level: int, prog: str, *, timestamps: bool = False) -> logging.Handler:
    """Send records at ``level`` and above to stderr as ``[time] prog LEVEL name: message``.

    Installs one stderr handler on the root logger; a handler installed by an earlier
    call (a test that runs two commands in one process) is replaced, handlers of others
    (pytest's) are left alone.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    stamp = "%(asctime)s " if timestamps else ""
    handler.setFormatter(logging.Formatter(
        f"{stamp}{prog.replace('%', '%%')} %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    return handler
