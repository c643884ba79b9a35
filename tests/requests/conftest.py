"""The request tests drive the real (patched) SGLang HTTP app; each module needs the tree first."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _patched_tree(sglang_tree):
    return sglang_tree
