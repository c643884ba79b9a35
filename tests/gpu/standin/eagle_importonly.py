"""Import-only stand-ins for packages a lent GPU machine lacks: sgl_kernel (built for another torch) and flash_mla
(the EAGLE worker imports it). Never on the serving image's path (_harness.py, _servers.LENT_PATHS add it).
`stand_in(__name__, ops)` in a package's __init__ makes it and its submodules importable: a name in `ops` is that
function, any other a falsy placeholder that raises NotImplementedError when called, so no kernel passes on a fake."""

import importlib.abc
import importlib.machinery
import sys
import types


class Placeholder:
    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> "Placeholder":
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._name} belongs to a package this machine lacks and this is an import-only stand-in "
            "(tests/gpu/standin): run where the real package is installed (the serving image)"
        )

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<import-only stand-in {self._name}>"


class _Module(types.ModuleType):
    ops: dict = {}

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return self.ops.get(attr) or Placeholder(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, package: str, ops: dict):
        self.package, self.ops = package, ops

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__, module.ops = [], self.ops
        return module

    def exec_module(self, module):
        pass


def stand_in(package: str, ops: dict | None = None) -> None:
    """Make `package` (being imported) and its submodules import-only stand-ins, with `ops` answered for real."""
    module = sys.modules[package]
    module.__class__ = _Module
    module.ops = ops or {}
    if not any(isinstance(f, _Finder) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_Finder(package, module.ops))
