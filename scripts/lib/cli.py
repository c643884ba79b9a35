"""Common main() wrapper: a UserError prints its message (no traceback) and exits with its code (2; 3 for a
ConflictError, a patch that does not apply); Ctrl-C exits 130; otherwise the exit status is what main returns."""

from __future__ import annotations

import sys
from typing import Callable

from .errors import UserError


def run(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> None:
    try:
        rc = main(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rc or 0)
