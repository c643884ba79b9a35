"""The two SGLang releases the tests use: the pinned one (patches/pin.toml; never named in the tests, so moving the
pin moves them) and one other, named here once, for the refusals of a wrong base and as a refresh target.

Imported as `_releases` (tests/ is on sys.path through tests/conftest.py, as `_fake_nvml` is).
"""

from scripts.series.pin import load_pin

PIN = load_pin()
OTHER = "0.5.22"  # any release other than the pinned one whose wheel PyPI has
OTHER_TAG = f"v{OTHER}"
OTHER_REQUIREMENT = f"sglang=={OTHER}"
OTHER_FILENAME = PIN.wheel_filename.replace(f"-{PIN.version}-", f"-{OTHER}-")
