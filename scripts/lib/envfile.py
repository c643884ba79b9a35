"""The one env-file parser: KEY=VALUE lines as `docker run --env-file` reads them (no quoting), `#` comments,
blank lines, an optional leading `export `."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import UserError

KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env(text: str, where: str = "env file") -> dict[str, str]:
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        if not sep or not KEY_RE.match(key.strip()):
            raise UserError(f"{where}:{n}: {raw!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def render_env(values: dict[str, str], header: list[str] = ()) -> str:
    """KEY=VALUE lines (after `# ` comment lines), in the order given."""
    return "".join(f"# {h}\n" for h in header) + "".join(f"{k}={v}\n" for k, v in values.items())


def read_env_file(path: Path) -> dict[str, str]:
    if not Path(path).is_file():
        raise UserError(f"env file {path} does not exist")
    return parse_env(Path(path).read_text(), str(path))
