"""What the bench family's tests share: a box receipt that holds only a profile part (make docs refits from it)."""

import json
from pathlib import Path

import pytest

from scripts.report import receipt_data as rd


@pytest.fixture
def profile_receipt():
    """profile_receipt(directory, profile) -> directory/box: a receipt with raw/profile.json and one inconclusive
    recommendation, as make report writes them."""

    def make(directory: Path, profile: dict) -> Path:
        d = directory / "box"
        (d / "raw").mkdir(parents=True)
        rec = {
            "default": "EAGLE-3 in the shipped profile",
            "verdict": "inconclusive",
            "why": "no bench",
            "measured": {},
            "threshold": "",
            "setting": "",
        }
        meta = {
            "schema": rd.SCHEMA,
            "parts": {"profile": {"ok": True}},
            "recommendations": [rec],
            "thresholds": rd.THRESHOLDS,
            "environment": {"box": "box"},
        }
        (d / "receipt.json").write_text(json.dumps(meta))
        (d / "raw" / "profile.json").write_text(json.dumps(profile))
        return d

    return make
