"""A stand-in for NVIDIA's CuTe DSL (`nvidia-cutlass-dsl`, imported as `cutlass`) on a GPU image without it.

SGLang 0.5.15's EAGLE worker (speculative/eagle_worker_v2.py, `_capture_cuda_graphs`) imports its DeepSeek sparse
attention backend on every CUDA machine while capturing the draft-extend CUDA graphs, and that module imports `cutlass`
at its top; on an image without the package an EAGLE-3 server with CUDA graphs dies while starting ("No module named
'cutlass'", seen on the lent H100 on 2026-12-06). Only DeepSeek sparse attention calls into it. Put this folder first on
PYTHONPATH of such a server (gpu/chain_sgl.sh does): every `cutlass` / `cutlass.*` name then imports, and any use of it
raises. Never on PYTHONPATH where the real package is installed."""

import importlib.abc
import importlib.machinery
import sys
import types


class _Stub:
    """Whatever the importing module touches at import time: attributes, calls, decorators, subscripts, bases."""

    def __init__(self, name: str = "cutlass"):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]                    # used as a decorator: leave the function as it is
        return _Stub(f"{self._name}()")

    def __getitem__(self, key):
        return _Stub(f"{self._name}[]")

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return f"<cutlass stub {self._name}>"


class _Module(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("cutlass."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _Module
__path__ = []
