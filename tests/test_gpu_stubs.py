"""gpu/stubs/sitecustomize.py: the stand-in for SGLang's DeepSeek sparse-attention module on a GPU image without the
CuTe DSL. Checked here in fresh interpreters against a small package laid out as SGLang's is (SGLang itself runs on the
GPU node only): the stand-in replaces that one module, only while `cutlass` cannot be found, and nothing else."""

import subprocess
import sys
from pathlib import Path

STUBS = Path(__file__).resolve().parent.parent / "gpu" / "stubs"

PROBE = """
import importlib.util
import sglang.srt.layers.attention.dsa_backend as m
from sglang.srt.layers.attention import other
B = m.DeepseekSparseAttnBackend
print(B.__module__, "stand-in" in (m.__doc__ or ""), other.VALUE, importlib.util.find_spec("cutlass") is not None)
try:
    B()
except RuntimeError as e:
    print("raises:", "nvidia-cutlass-dsl" in str(e))
"""


def _fake_sglang(root: Path, with_cutlass: bool) -> None:
    pkg = root / "sglang" / "srt" / "layers" / "attention"
    pkg.mkdir(parents=True)
    for d in (root / "sglang", root / "sglang" / "srt", root / "sglang" / "srt" / "layers", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "dsa_backend.py").write_text("import cutlass\nclass DeepseekSparseAttnBackend:\n    'real'\n")
    (pkg / "other.py").write_text("VALUE = 42\n")
    if with_cutlass:
        (root / "cutlass").mkdir()
        (root / "cutlass" / "__init__.py").write_text("")


def _probe(tmp_path: Path, with_cutlass: bool, stubs: bool) -> subprocess.CompletedProcess:
    _fake_sglang(tmp_path, with_cutlass)
    path = ([str(STUBS)] if stubs else []) + [str(tmp_path)]
    return subprocess.run([sys.executable, "-c", PROBE], env={"PYTHONPATH": ":".join(path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


def test_without_cutlass_the_dsa_module_is_the_stand_in_and_nothing_else_changes(tmp_path):
    r = _probe(tmp_path, with_cutlass=False, stubs=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "sitecustomize True 42 False"         # the stand-in; other modules real; cutlass still absent
    assert lines[1] == "raises: True"                          # using it says what is missing


def test_the_real_module_when_cutlass_is_there_and_the_failure_without_the_stubs(tmp_path):
    r = _probe(tmp_path / "a", with_cutlass=True, stubs=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("sglang.srt.layers.attention.dsa_backend False 42 True")
    r = _probe(tmp_path / "b", with_cutlass=False, stubs=False)   # what the lent H100 did without them
    assert r.returncode != 0 and "No module named 'cutlass'" in r.stderr
