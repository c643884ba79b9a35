"""The serving profiles (docker/profiles/*.yaml, SGLang `--config` files): found by name or path, read with PyYAML as
SGLang reads them. serve launches one; make bench and the receipt read their settings."""

from pathlib import Path

from .errors import UserError
from .repo import PROFILES_DIR, REPO_ROOT


def find(profile: str) -> Path:
    """A profile by name (docker/profiles/NAME.yaml) or by path (one that is not here: from this checkout's root);
    a UserError naming the known ones when there is none."""
    path = PROFILES_DIR / f"{profile}.yaml"
    if profile.endswith((".yaml", ".yml")):
        path = Path(profile) if Path(profile).is_absolute() or Path(profile).exists() else REPO_ROOT / profile
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
        raise UserError(f"no profile {profile} (known: {known}); or pass the path of a .yaml file that exists")
    return path


def load(path: Path) -> dict:
    try:
        import yaml
    except ImportError as e:
        raise UserError("the profiles are read with PyYAML: pip install pyyaml, or run it in the image") from e
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise UserError(f"profile {path} is not a YAML mapping of SGLang flags (key: value)")
    return data


def settings(profile: str, args: tuple[str, ...] | list[str] = ()) -> dict:
    """What a server of this profile runs with: the profile's values (keys as its long flags), each `--key value`
    of the arguments that follow it on top, the last one winning, as SGLang merges them."""
    values = {str(k).replace("_", "-"): v for k, v in load(find(profile)).items()}
    for i, a in enumerate(args):
        key, eq, value = a.partition("=")
        if not key.startswith("--"):
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True
        values[key[2:]] = value
    return values
