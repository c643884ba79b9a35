"""The one way the tooling runs another program: with a timeout, and a failure that says why, never a traceback.

`run()` waits for the program and returns a `Result` (ok, exit code, output, and `why` when not ok: not installed,
timed out, could not start, or the exit code and the last line it printed). `spawn()` starts a long-lived process
(a server, a streaming client) whose owner stops it. Nothing else in scripts/ imports subprocess.
"""

import dataclasses
import os
import shutil
import signal
import subprocess
from pathlib import Path

DEFAULT_TIMEOUT = 60.0
PIPE, STDOUT = subprocess.PIPE, subprocess.STDOUT
TimeoutExpired = subprocess.TimeoutExpired


@dataclasses.dataclass
class Result:
    """What a program did: ok, its exit code (None if it never ran or timed out), its output, and why not ok."""

    ok: bool
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    why: str = ""

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def which(program: str) -> str | None:
    """Path of an executable (a name on PATH, or an absolute path that is executable)."""
    if os.path.isabs(program):
        return program if os.access(program, os.X_OK) else None
    return shutil.which(program)


def run(
    argv: list[str],
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    input: str | None = None,
    capture: bool = True,
) -> Result:
    """Run argv to completion. capture=False lets the output through to the terminal (downloads, builds)."""
    shown = " ".join(map(str, argv))
    exe = which(str(argv[0]))
    if exe is None:
        return Result(False, why=f"{argv[0]} not found (not installed or not on PATH)")
    try:
        cp = subprocess.run(
            [exe, *map(str, argv[1:])],
            capture_output=capture,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env,
            input=input,
        )
    except subprocess.TimeoutExpired:
        return Result(False, why=f"`{shown}` did not answer within {timeout:.0f}s")
    except OSError as e:
        return Result(False, why=f"`{shown}` could not run: {e}")
    if cp.returncode in (-signal.SIGINT, 128 + signal.SIGINT):
        raise KeyboardInterrupt  # Ctrl-C reached the program too: the caller's cleanup and message, not its own
    out, err = cp.stdout or "", cp.stderr or ""
    if cp.returncode != 0:
        lines = (out + err).strip().splitlines()
        return Result(
            False, cp.returncode, out, err, f"`{shown}` exit {cp.returncode}: {lines[-1] if lines else '(no output)'}"
        )
    return Result(True, 0, out, err)


def spawn(argv: list[str], **kw) -> subprocess.Popen:
    """Start a long-lived process (keyword arguments as for subprocess.Popen); the caller waits for or stops it."""
    return subprocess.Popen(argv, **kw)
