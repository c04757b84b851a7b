"""Stand-ins for modules upstream's Qualcomm llama scripts import but the wheel does not install.

ExecuTorch 1.4.1's ``examples/qualcomm/oss_scripts/llama`` package imports every family it supports
at start-up (``__init__.py``), and with them their checkpoint converters: phi_4_mini's, qwen2_5's and
granite_speech's import torchtune, whose latest release (0.6.1) does not import with the torchao the
wheel pins (``torchao.dtypes.nf4tensor`` is gone). None of it runs for the families the tests drive (a
checkpoint is given, so no converter is called). That import alone is met here: a module that is absent gets a stand-in whose every name is a class that refuses to be
built or called, so anything that would really use it fails loudly, naming the module. Installed
modules are never replaced, and nothing of upstream's code is.

``install()`` puts the finder on ``sys.meta_path``; it is meant for a child process of its own
(tests/support/llama_py.py), never a test worker.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

MISSING = ("torchtune",)


def _refusing(module: str, name: str) -> type:
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{module}.{name}: {module} is not installed (a stand-in for an import of "
                           "upstream's that the families under test never use)")

    return type(name, (), {"__new__": lambda cls, *a, **k: refuse(), "__init_subclass__": classmethod(
        lambda cls, **k: None), "__class_getitem__": classmethod(lambda cls, item: cls)})


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _refusing(self.__name__, name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: tuple[str, ...]):
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install(names: tuple[str, ...] = MISSING) -> tuple[str, ...]:
    """Stand-ins for those of ``names`` that are not installed; returns them."""
    absent = tuple(n for n in names if importlib.util.find_spec(n) is None)
    if absent:
        sys.meta_path.append(_Finder(absent))
    return absent
