"""The serving profiles (docker/profiles/*.yaml, SGLang `--config` files): found by name or path, read with PyYAML as
SGLang reads them. serve launches one; make bench and the receipt read their settings."""

from __future__ import annotations

from pathlib import Path

from .errors import UserError
from .repo import PROFILES_DIR, REPO_ROOT


def find(profile: str) -> Path:
    """A profile by name (docker/profiles/NAME.yaml) or by path (one that is not here: from this checkout's root)."""
    if not profile.endswith((".yaml", ".yml")):
        return PROFILES_DIR / f"{profile}.yaml"
    path = Path(profile)
    return path if path.is_absolute() or path.exists() else REPO_ROOT / path


def load(path: Path) -> dict:
    try:
        import yaml
    except ImportError as e:
        raise UserError("the profiles are read with PyYAML: pip install pyyaml, or run it in the image") from e
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise UserError(f"profile {path} is not a YAML mapping of SGLang flags (key: value)")
    return data


def setting(profile: str, key: str, args: tuple[str, ...] | list[str] = ()) -> int:
    """An integer SGLang setting of a served profile: the last `--key N` in the arguments that follow it, else the
    profile's own (0: unset)."""
    flag = f"--{key}"
    given = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
    given += [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    if given:
        return int(given[-1])
    values = load(find(profile))
    return int(values.get(key) or values.get(key.replace("-", "_")) or 0)
