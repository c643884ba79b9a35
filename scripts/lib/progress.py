"""Progress lines for slow steps (download, unpack, apply): plain text on stderr."""

import sys


def say(msg: str) -> None:
    print(f"[eagle-patches] {msg}", file=sys.stderr, flush=True)
