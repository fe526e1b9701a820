"""One bash session that runs a page's command blocks in order, as a user types them.

The blocks of one session share a shell: what one ``export``s, the directory it
``cd``s to and the jobs it starts with ``&`` are there for the next (``kill %1`` works).
Each block is sourced with its output in a file of its own; a command of it that fails
is recorded (an ``ERR`` trap, with ``pipefail``) and the block goes on, as a user's
terminal does, so that the test names every failing line. At the end the session's
process group is ended (what a block left running in the background, if it did not
stop it itself).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

#: The trap prints the failing command and its status to the block's failure file.
_PRELUDE = """set -o pipefail
trap 'echo "line $LINENO: exit $?: $BASH_COMMAND" >> "$WEAVE_DOCS_FAILS"' ERR
"""


@dataclass(frozen=True)
class BlockRun:
    rc: int
    output: str
    failures: list[str]


class ShellSession:
    """``bash --norc`` in ``cwd`` with ``env``; :meth:`run` sources one block at a time."""

    def __init__(self, work: Path, cwd: Path, env: dict[str, str]) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self.stuck: str | None = None   # a block that did not end: the shell is still in it
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, cwd=cwd, env=env,
            stdout=(work / "session.out").open("w"), stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self._send(_PRELUDE)

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def run(self, code: str, timeout_s: float) -> BlockRun:
        """Source ``code`` in the session; its exit status, output and failed commands."""
        if self.stuck is not None:
            raise AssertionError(f"not run: the session is still in an earlier block:\n"
                                 f"{self.stuck}")
        self.count += 1
        n = self.count
        script, out, fails, rc = (self.work / f"block{n}.{ext}"
                                  for ext in ("sh", "out", "fails", "rc"))
        script.write_text(code)
        fails.touch()
        self._send(f'export WEAVE_DOCS_FAILS={fails}\nsource {script} > {out} 2>&1 < /dev/null\n'
                   f'echo $? > {rc}.tmp && mv {rc}.tmp {rc}\n')
        deadline = time.monotonic() + timeout_s
        while not rc.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the shell ended (exit {self.proc.returncode}) in:\n"
                                     f"{code}\noutput:\n{_read(out)}")
            if time.monotonic() > deadline:
                self.stuck = code
                raise AssertionError(f"still running after {timeout_s:.0f} s:\n{code}\n"
                                     f"output so far:\n{_read(out)}")
            time.sleep(0.1)
        return BlockRun(int(rc.read_text()), _read(out), fails.read_text().splitlines())

    def close(self, grace_s: float = 10.0) -> None:
        """End the shell and every process of its group (background jobs included)."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            time.sleep(1.0 if sig == signal.SIGTERM else 0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
