"""Patch tests import the real (patched) SGLang code; each module needs the tree first."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _patched_tree(sglang_tree):
    return sglang_tree
