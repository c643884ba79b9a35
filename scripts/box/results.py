"""Where the box verbs write and how they name what they write: one results directory, one box name, one UTC stamp,
one JSON writer; and the test tiers' result (pytest's own junitxml) read back as make report reads it.

A result file is <verb>_<box>_<stamp>.<ext> in results_dir(); <box> is the GPUs' model and count (H200-x2), never
the host name: results leave the box.
"""

import datetime as _dt
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from xml.sax.saxutils import escape

from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from .docker import RESULTS_IN_IMAGE
from .preflight import gpus

RESULTS_VAR = "EAGLE_RESULTS"  # the image sets it to /results, the directory the host mounts


def results_dir() -> Path:
    """Where a verb writes: $EAGLE_RESULTS (in the image: the mount, which must exist), else bench/results."""
    named = os.environ.get(RESULTS_VAR)
    if not named:
        return REPO_ROOT / "bench" / "results"
    if not Path(named).is_dir():
        raise UserError(
            f"{RESULTS_VAR}={named} does not exist, so the results would stay in the container: mount a directory "
            f'there (docker run -v "$PWD/bench/results:{RESULTS_IN_IMAGE}" ...)'
        )
    return Path(named)


def now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def stamp(t: _dt.datetime | None = None) -> str:
    """The one UTC stamp of file and directory names: 20261201T124738Z (its first 8 characters: the day)."""
    return f"{t or now():%Y%m%dT%H%M%SZ}"


def iso(t: _dt.datetime | None = None) -> str:
    """A UTC time inside a record: 2026-12-01T12:47:38+00:00."""
    return (t or now()).isoformat(timespec="seconds")


def box_name(names: list[str] | None = None) -> str:
    """H200-x2 from two 'NVIDIA H200'; RTX-PRO-6000-Blackwell-Server-Edition-x8 on the box; nogpu without one."""
    names = gpus()[0] if names is None else names
    if not names:
        return "nogpu"
    slug = re.sub(r"[^A-Za-z0-9]+", "-", re.sub(r"^NVIDIA\s+", "", names[0])).strip("-")
    return f"{slug}-x{len(names)}"


def result_file(verb: str, suffix: str, box: str | None = None, directory: Path | None = None) -> Path:
    """<directory, default results_dir()>/<verb>_<box>_<stamp><suffix>."""
    return (directory or results_dir()) / f"{verb}_{box or box_name()}_{stamp()}{suffix}"


def write_json(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


def finish_junit(path: Path, properties: dict, masks: dict[str, str]) -> None:
    """A test tier's junitxml made a result that leaves the box: the run's properties (JSON values) on its
    <testsuite>, and no path of this machine (each replaced by its mask, the longest first)."""
    tree = ET.parse(path)
    suite = tree.getroot() if tree.getroot().tag == "testsuite" else tree.getroot().find("testsuite")
    props = suite.find("properties")
    if props is None:
        props = ET.Element("properties")
        suite.insert(0, props)
    for name, value in properties.items():
        ET.SubElement(props, "property", name=name, value=json.dumps(value, default=str))
    text = ET.tostring(tree.getroot(), encoding="unicode")
    for found in sorted((m for m in masks if len(m) > 1), key=len, reverse=True):
        text = text.replace(found, escape(masks[found]))
    path.write_text(text + "\n")


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def read_junit(path: Path) -> dict:
    """A test tier's junitxml as the receipt reads it: the counts, one entry per test case (outcome, message and its
    recorded properties) and the suite's properties (JSON values decoded)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise UserError(f"{path.name} is not a pytest junitxml file ({e})") from e
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise UserError(f"{path.name} has no <testsuite>: not a pytest junitxml file")
    cases = []
    for c in suite.iter("testcase"):
        bad = next((c.find(k) for k in ("failure", "error", "skipped") if c.find(k) is not None), None)
        outcome = {"failure": "failed", "error": "failed", "skipped": "skipped"}.get(getattr(bad, "tag", ""), "passed")
        message = "" if bad is None else (bad.get("message") or bad.text or "")
        props = {p.get("name"): _value(p.get("value", "")) for p in c.iter("property")}
        name = f"{c.get('classname')}::{c.get('name')}"
        cases.append({"name": name, "outcome": outcome, "message": message, "properties": props})
    props = {p.get("name"): _value(p.get("value", "")) for p in suite.findall("properties/property")}
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    return {**counts, "cases": cases, "properties": props}
