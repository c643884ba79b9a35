"""The one TOML reader of the tooling: a file that is missing or not TOML is a UserError that names it and the fix."""

import tomllib
from pathlib import Path

from .errors import UserError


def load_toml(path: Path, what: str = "", fix: str = "pass an existing file or restore it from git") -> dict:
    """The parsed file; `what` names it in errors (e.g. "profile"), `fix` says what to do when it is missing."""
    shown = f"{what} {path}" if what else str(path)
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise UserError(f"{shown}: {e.strerror or e}; {fix}") from e
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{shown} is not valid TOML: {e}") from e
