"""Common main() wrapper, and a verb's argument parser. main(): a UserError prints its message (no traceback) and exits
with its code (2; 3 for a ConflictError, a patch that does not apply). Ctrl-C, SIGTERM and SIGHUP (a dropped ssh)
take one way out, Python's KeyboardInterrupt, so every `finally` stops what the verb started; the exit status is then
128 + the signal. Otherwise the exit status is what main returns."""

import argparse
import os
import signal
import stat
import sys
from typing import Callable

from .errors import UserError


def _interrupt(signum, frame) -> None:
    if signum == signal.SIGHUP:  # the terminal is gone: writing to it must not fail the cleanup
        for fd in (1, 2):
            if stat.S_ISCHR(os.fstat(fd).st_mode):
                os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    raise KeyboardInterrupt(signum)


def run(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's choice stands
            signal.signal(sig, _interrupt)
    try:
        rc = main(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:
        signum = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT
        print(f"interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        sys.exit(128 + signum)
    sys.exit(rc or 0)


def parser(prog: str, doc: str | None = None, **kw) -> argparse.ArgumentParser:
    """A verb's parser, its help text the module docstring (`doc`) as written."""
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, **kw
    )


def split(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """(a verb's own arguments, the ones after --) of argv, else of the command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    i = argv.index("--") if "--" in argv else len(argv)
    return argv[:i], argv[i + 1 :]
