"""Progress lines for slow steps (download, unpack, apply). Plain text, one line per update on a pipe."""

import sys
import time


def say(msg: str) -> None:
    print(f"[eagle-patches] {msg}", file=sys.stderr, flush=True)


class Progress:
    """Counts work items; redraws in place on a terminal, prints every ~10% otherwise."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done = label, max(total, 1), 0
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()
        self._last_decile = -1

    def step(self, n: int = 1) -> None:
        self.done += n
        pct = 100 * self.done // self.total
        if self.tty:
            print(f"\r[eagle-patches] {self.label}: {self.done}/{self.total} ({pct}%)", end="", file=sys.stderr, flush=True)
        elif pct // 10 != self._last_decile:
            self._last_decile = pct // 10
            say(f"{self.label}: {self.done}/{self.total} ({pct}%)")

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)
        say(f"{self.label}: done in {time.monotonic() - self.t0:.1f}s")
