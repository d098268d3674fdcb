"""Started by every Python interpreter that has gpu/stubs on its PYTHONPATH (sitecustomize): lets SGLang 0.5.15 start an
EAGLE-3 server with CUDA graphs on a GPU image without NVIDIA's CuTe DSL (`nvidia-cutlass-dsl`, imported as `cutlass`).

SGLang's EAGLE worker (speculative/eagle_worker_v2.py `_capture_cuda_graphs`) imports its DeepSeek sparse-attention
backend on every CUDA machine, only to list it among the backends that support the draft-extend graph; that module
imports `cutlass` at its top, so on the lent H100 of 2026-12-06 every EAGLE-3 server died while starting ("No module
named 'cutlass'"). A stand-in for `cutlass` itself does not do: flashinfer then believes the CuTe DSL is there and
takes its CuTe path for rmsnorm (seen: "unsupported operand type(s)" in flashinfer/norm/kernels/rmsnorm.py). So this
replaces only `sglang.srt.layers.attention.dsa_backend`, and only when `cutlass` cannot be found, by a module whose
`DeepseekSparseAttnBackend` is a class nothing is an instance of: the isinstance check then says "not that backend",
which is true for every model that does not use DeepSeek sparse attention. Any other use of the module raises."""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STUBBED = "sglang.srt.layers.attention.dsa_backend"


class DeepseekSparseAttnBackend:
    """Never instantiated: stands for a backend this image cannot run."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{STUBBED} is a stand-in (gpu/stubs/sitecustomize.py): DeepSeek sparse attention needs "
                           "nvidia-cutlass-dsl on this machine")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname != STUBBED:
            return None
        try:
            if importlib.util.find_spec("cutlass") is not None:
                return None                   # the real DSL is there: the real module
        except (ImportError, ValueError):
            pass
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        module.DeepseekSparseAttnBackend = DeepseekSparseAttnBackend
        module.__doc__ = "stand-in: see gpu/stubs/sitecustomize.py"


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
