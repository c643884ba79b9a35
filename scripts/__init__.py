"""Tooling for the SGLang EAGLE fast-verify patch series (one module per verb).

Every `python -m scripts...` imports this first: a Python below 3.11 (tomllib, the syntax) is named with the fix here,
before any module that needs it is imported."""

import sys

if sys.version_info < (3, 11):
    sys.stderr.write(
        "error: the tooling needs Python >= 3.11, and %s is %s. Run it with a newer one, e.g. make "
        "<target> PY=python3.11 (Ubuntu 22.04: apt-get install python3.11 python3.11-venv)\n"
        % (sys.executable, "%d.%d" % tuple(sys.version_info[:2]))
    )
    raise SystemExit(2)
