"""Import-only stand-in for sgl-kernel, for machines that cannot install the real one.

SGLang's argument resolution and distributed bring-up import modules that import `sgl_kernel` (quantization,
KV-cache helpers), although the collectives the GPU tier tests never call an sgl-kernel op. The real sgl-kernel
wheel is built for one torch (the one the pinned SGLang requires) and is too large to carry to a lent GPU machine
with another torch; the CI machine has no GPU build of it at all. This package makes every `sgl_kernel` and `sgl_kernel.*` import
succeed; every attribute is a placeholder that raises when it is called, named by what was asked for, so a test
that reaches a kernel fails loudly instead of passing on a fake. The serving image has the real sgl-kernel and
never puts this directory on sys.path (tests/gpu/harness.py adds it only when `import sgl_kernel` fails).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STANDIN = True
__version__ = "0.0.0+standin"


class _Missing:
    """A stand-in for an sgl-kernel symbol: fine to import and pass around, an error to call."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name} is an sgl-kernel op and this is an import-only stand-in "
                                  "(tests/gpu/standin); run with the real sgl-kernel (the serving image has it)")

    def __getattr__(self, attr: str) -> "_Missing":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._name}>"


class _Module(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def __getattr__(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Missing(f"sgl_kernel.{attr}")


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
