"""Import-only stand-ins for packages the lent GPU machines lack and the served tiny models only import.

  cutlass    (nvidia-cutlass-dsl) SGLang's Llama MLP imports its SM100 CuTe-DSL dual GEMM module
             (sglang/kernels/ops/gemm/cutedsl_dual_gemm.py) on CUDA, then never uses it below SM100
             (can_use_dual_gemm).
  flash_mla  (sgl-flash-mla) the EAGLE worker imports FlashMLABackend for an isinstance check before the
             draft-extend graph capture (sglang/srt/speculative/eagle_worker_v2.py); FlashMLA never runs.

`stand_in(__name__)` in a package's __init__ makes the package and every submodule importable; any name taken
from them is a placeholder. Module-level code of the importers works with it (decorators such as
`@cute.experimental.jit` return the function; attribute chains, subscripts, type unions, base classes); calling a
placeholder any other way raises NotImplementedError, so a kernel that would really run cannot pass on a fake.
With EAGLE_STANDIN_LOG=FILE such a call is logged as "<pid> missing <name>" first.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

LOG_VAR = "EAGLE_STANDIN_LOG"


class Placeholder:
    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> "Placeholder":
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], Placeholder):
            return args[0]  # used as a decorator
        path = os.environ.get(LOG_VAR)
        if path:
            with open(path, "a") as f:
                f.write(f"{os.getpid()} missing {self._name}\n")
        raise NotImplementedError(f"{self._name} belongs to a package this machine lacks; this is an import-only "
                                  "stand-in (tests/serve/standin), so it cannot run. Run where the real package "
                                  "is installed (the serving image)")

    def __getitem__(self, key) -> "Placeholder":
        return Placeholder(f"{self._name}[...]")

    def __or__(self, other) -> "Placeholder":  # type unions in annotations: Float32 | None
        return self

    __ror__ = __or__

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<import-only stand-in {self._name}>"


class _Module(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, package: str):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def stand_in(package: str) -> None:
    """Make `package` (already being imported) and its submodules import-only stand-ins."""
    sys.modules[package].__class__ = _Module
    if not any(isinstance(f, _Finder) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_Finder(package))
