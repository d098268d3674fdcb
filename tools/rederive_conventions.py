"""Re-derive the vLLM and SGLang rows of backend/conventions.yaml from the released wheels, and fail when a
release's code at the places that decide them says something the table does not.

    python tools/rederive_conventions.py                      # check every release the table names (downloads)
    python tools/rederive_conventions.py --engine vllm --releases 0.24.0 0.25.1
    python tools/rederive_conventions.py --write              # rewrite the derived rows (keeps status/seen/note)
    python tools/rederive_conventions.py --json docs/results/conventions_derived.json
    python tools/rederive_conventions.py --facts docs/results/conventions_derived.json --markdown docs/RELEASES.md
                                                              # offline: the stored facts, no download
    python tools/rederive_conventions.py --fields [--write]   # backend/drafter_fields.yaml: the drafter config
                                                              # fields (norm_before_fc, fc_norm, ...) each release
                                                              # honours or ignores (see "drafter config fields")

Each wheel is fetched with `pip download --no-deps vllm==X` (300-400 MB for vLLM, a few MB for SGLang); only the
few .py files read below are kept (under --cache, default ~/.cache/speclens/wheels) and the wheel is deleted.

What is read, per vLLM release (the file and function each row cites):
- runner choice: vllm/config/vllm.py `VllmConfig.use_v2_model_runner`, `_is_default_v2_model_runner_model`,
  `DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`, `_get_v2_model_runner_unsupported_features` (the feature names it
  appends), vllm/envs.py `VLLM_USE_V2_MODEL_RUNNER` (its default when unset); the conditions that force V2 in
  `use_v2_model_runner` (`forces_v2`: prefill context parallelism 0.27-0.28, HiSparse and watermarking 0.30+) and
  what VLLM_USE_V2_MODEL_RUNNER=0 does to each (`forces_v2_env0`: env_wins when checked after the variable, error
  when checked before it and =0 raises, overrides when checked before it and V2 runs anyway);
- where the aux ids are read: V1 vllm/v1/worker/gpu_model_runner.py `GPUModelRunner._get_eagle3_aux_layers_from_config`,
  V2 vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py `get_eagle3_aux_layers_from_config`;
- the default: vllm/model_executor/models/interfaces.py `SupportsEagle3.get_eagle3_default_aux_hidden_state_layers`
  (DeepSeek: deepseek_v2.py `DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers`);
- what an id means: vllm/model_executor/models/llama.py `LlamaModel.forward` (the state entering layer a).
Per SGLang release: where eagle_config is read (the sglang/srt/model_executor function that indexes
`eagle_config["eagle_aux_hidden_state_layer_ids"]`), and each family's `set_eagle3_layers_to_capture` (llama.py,
qwen3.py, qwen3_moe.py, qwen2.py, deepseek_v2.py, glm4_moe_lite.py, gpt_oss.py): its rule (+1, conditional +1,
none) and default.

A function's hash is sha256 of its source as `ast.unparse` writes it without its docstring (12 hex digits): a
release whose code at a cited place differs from the table's hash fails even when the parsed facts agree, so a
change the parser cannot see is still caught and must be read by a person.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:                 # run as a script: the repository's backend/options.py names the runners
    sys.path.insert(0, str(REPO))
from backend.options import VLLM_RUNNERS, engine_label  # noqa: E402  (imports the standard library and `packaging` only)

TABLE = REPO / "backend" / "conventions.yaml"
BEGIN = "# ---- BEGIN rows derived from the wheels (tools/rederive_conventions.py --write keeps status, seen, note)"
END = "# ---- END derived rows"

VLLM_RELEASES = ["0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0",
                 "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]
# SGLang 0.5.0 was never published on PyPI (the first 0.5 release there is 0.5.1); .postN releases share a row
SGLANG_RELEASES = [f"0.5.{i}" for i in range(1, 24)]
# the engines whose wheels this tool reads (backend/options.py SERVING_ENGINES; each has its readers below), in the
# order their rows are derived
RELEASES = {"vllm": VLLM_RELEASES, "sglang": SGLANG_RELEASES}

VLLM_FILES = {
    "config": "vllm/config/vllm.py",
    "envs": "vllm/envs.py",
    "v1": "vllm/v1/worker/gpu_model_runner.py",
    "v2": "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
    "iface": "vllm/model_executor/models/interfaces.py",
    "deepseek": "vllm/model_executor/models/deepseek_v2.py",
    "llama": "vllm/model_executor/models/llama.py",
}
SGLANG_MODEL_FILES = {"llama": "llama.py", "qwen3": "qwen3.py", "qwen3_moe": "qwen3_moe.py", "qwen2": "qwen2.py",
                      "deepseek_v2": "deepseek_v2.py", "glm4_moe_lite": "glm4_moe_lite.py", "gpt_oss": "gpt_oss.py"}
# table family groups of SGLang rows -> the model file that decides them (the catch-all also checks the qwen files).
# The family lists are checked per release against the wheel: each family's architecture (MODEL_TYPE_ARCH) must take
# its set_eagle3_layers_to_capture (EntryClass, then the class's method order) from the group's files, or have none
# where the group's rule is unsupported; the rows carry the architectures each group's files serve (`architectures`)
SGLANG_GROUPS = (
    (("deepseek_v2", "deepseek_v3", "kimi_k2"), "deepseek_v2"),
    (("glm4_moe_lite",), "glm4_moe_lite"),
    (("gpt_oss",), "gpt_oss"),
    (("*",), "llama"),
)
# the families of the vLLM DeepSeek rows: checked against the classes of deepseek_v2.py that run the DeepSeek default
VLLM_DEEPSEEK_FAMILIES = ("deepseek_v2", "deepseek_v3", "kimi_k2")
SGLANG_CATCH_ALL_FILES = ("llama", "qwen3", "qwen3_moe", "qwen2")
# HF config model_type (the table's family names, backend/coords.py family_of) -> the architecture its configs name
# (transformers' mapping, not engine code; Kimi-K2 ships DeepseekV3ForCausalLM): the one hand-set link between a
# family and a wheel's EntryClass / class names
MODEL_TYPE_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                   "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                   "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                   "kimi_k2": "DeepseekV3ForCausalLM", "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
                   "gpt_oss": "GptOssForCausalLM"}
VALID = {  # the ids a rule can take, as the table states them (read in the model code, not run at the edges)
    ("vllm", "input", "*"): [0, "N"], ("vllm", "input", "deepseek"): [1, "N-1"],
    ("sglang", "after"): [-1, "N-2"], ("sglang", "after_if_first_1"): [-1, "N-1"],
    ("sglang", "input_if_max_n"): [-1, "N"], ("sglang", "input"): [0, "N-1"], ("sglang", "unsupported"): [0, 0],
}


class Drift(Exception):
    """A release's code says something the table does not."""


# ------------------------------------------------------------------------------------------- wheels -> sources

def cache_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("SPECLENS_WHEEL_CACHE") or Path.home() / ".cache" / "speclens" / "wheels")


def _wanted(engine: str, name: str) -> bool:
    if not name.endswith(".py"):
        return False
    if engine == "vllm":   # the rule files, and every model file (the EAGLE-3 drafters' field reading, below)
        return name in VLLM_FILES.values() or name.startswith("vllm/model_executor/models/")
    # every model file: which architectures (EntryClass) take which set_eagle3_layers_to_capture
    return (name.startswith("sglang/srt/model_executor/") or name == "sglang/srt/server_args.py"
            or name.startswith("sglang/srt/models/"))


# what an extracted cache holds; a cache without this mark (older extraction: the rule files only) is
# re-extracted from the same wheel (its sha256 must not change)
CACHE_MARK = {"vllm": "2: vllm/model_executor/models/**", "sglang": "2: sglang/srt/models/**"}


def sources(engine: str, version: str, cache: Path, pip: str = sys.executable) -> Path:
    """The directory holding the release's files read here, downloading the wheel once."""
    dest = cache / f"{engine}-{version}"
    mark = dest / "EXTRACTED"
    if (dest / "WHEEL_SHA256").exists() and mark.exists() and mark.read_text().strip() == CACHE_MARK[engine]:
        return dest
    return _extract(engine, version, dest, lambda n: _wanted(engine, n), {"EXTRACTED": CACHE_MARK[engine]}, pip)


def _extract(engine: str, version: str, dest: Path, wanted, marks: dict[str, str], pip: str) -> Path:
    """Download the release's wheel, extract the files `wanted` keeps into `dest` (through a .part folder renamed
    into place) with its sha256, name and the `marks` files; refuse a wheel whose sha256 differs from the one cached
    before."""
    before = (dest / "WHEEL_SHA256").read_text().strip() if (dest / "WHEEL_SHA256").exists() else None
    with tempfile.TemporaryDirectory(prefix=f"wheel-{engine}-") as tmp:
        cmd = [pip, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"{engine}=={version}", "-d", tmp,
               "-q"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            raise SystemExit(f"pip download {engine}=={version} failed: {(r.stderr or r.stdout).strip()[-400:]}")
        part = dest.with_name(dest.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        with zipfile.ZipFile(wheels[0]) as z:
            for n in z.namelist():
                if wanted(n):
                    z.extract(n, part)
        h = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        if before is not None and before != h:
            raise SystemExit(f"{engine}=={version}: the wheel downloaded now (sha256 {h[:12]}) is not the one cached "
                             f"before ({before[:12]}); read what changed")
        (part / "WHEEL_SHA256").write_text(h + "\n")
        (part / "WHEEL_NAME").write_text(wheels[0].name + "\n")
        for name, text in marks.items():
            (part / name).write_text(text + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        part.rename(dest)
    return dest


# ------------------------------------------------------------------------------------------- kinds: full sources

KINDS_MARK = "kinds: every .py file"


def kind_sources(engine: str, version: str, cache: Path, pip: str = sys.executable) -> Path:
    """Like `sources`, but every .py file of the package is kept (the drafter kinds' code lives in spec_decode,
    config and transformers_utils files as well as the model files); the directory also serves `sources`."""
    dest = cache / f"{engine}-{version}"
    mark = dest / "KINDS_EXTRACTED"
    if (dest / "WHEEL_SHA256").exists() and mark.exists() and mark.read_text().strip() == KINDS_MARK:
        return dest
    pkg = engine.replace("-", "_")
    top = {"nvidia_modelopt": "modelopt"}.get(pkg, pkg)
    marks = {**({"EXTRACTED": CACHE_MARK[engine]} if engine in CACHE_MARK else {}), "KINDS_EXTRACTED": KINDS_MARK}
    return _extract(engine, version, dest, lambda n: n.endswith(".py") and n.split("/", 1)[0] == top, marks, pip)


# ------------------------------------------------------------------------------------------- source reading

def _tree(path: Path) -> tuple[ast.Module, str] | None:
    if not path.exists():
        return None
    src = path.read_text(encoding="utf-8-sig")        # some SGLang model files start with a byte-order mark
    return ast.parse(src), src


def find(path: Path, qual: str) -> ast.AST | None:
    """The def (or class) `qual` ("Class.method" or "function") in the file, or None."""
    t = _tree(path)
    if t is None:
        return None
    body, node = t[0].body, None
    for part in qual.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def text(node: ast.AST | None) -> str:
    """The function's source as ast.unparse writes it, without its docstring."""
    if node is None:
        return ""
    n = ast.parse(ast.unparse(node)).body[0]
    b = getattr(n, "body", [])
    if b and isinstance(b[0], ast.Expr) and isinstance(b[0].value, ast.Constant) and isinstance(b[0].value.value, str):
        n.body = b[1:] or [ast.Pass()]
    return ast.unparse(n)


def digest(node: ast.AST | None) -> str | None:
    return hashlib.sha256(text(node).encode()).hexdigest()[:12] if node is not None else None


def module_constant(path: Path, name: str):
    t = _tree(path)
    if t is None:
        return None
    for n in t[0].body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        if any(getattr(x, "id", None) == name for x in targets) and n.value is not None:
            v = n.value
            if isinstance(v, ast.Call) and v.args:          # frozenset({...})
                v = v.args[0]
            return sorted(ast.literal_eval(v))
    return None


def appended_features(node: ast.AST | None) -> list[str]:
    """The feature names `unsupported.append(...)` adds (f-strings cut at their first placeholder)."""
    out = []
    for n in ast.walk(node) if node is not None else []:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append" and n.args:
            a = n.args[0]
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                name = a.value
            elif isinstance(a, ast.JoinedStr):
                name = "".join(v.value for v in a.values if isinstance(v, ast.Constant))
                name = name.split("'")[0].strip() if "'" in name else name.strip()
            else:
                continue
            if name not in out:
                out.append(name)
    return out


def expr_in_n(src: str) -> list[str] | None:
    """'[2, num_layers // 2, num_layers - 3]' (or a tuple) -> ['2', 'N//2', 'N-3']."""
    m = re.search(r"[\[(]\s*2\s*,\s*num_layers\s*//\s*2\s*,\s*num_layers\s*-\s*3\s*[\])]", src)
    return ["2", "N//2", "N-3"] if m else None


# ------------------------------------------------------------------------------------------- class inheritance

def class_index(files: dict[str, Path]) -> dict[str, dict]:
    """The classes of the given modules ({module name: path}), keyed "module.Class": their bases resolved through
    the module's `from M import C [as D]` / `import M as m` (a base not found among `files` stays a bare name) and
    the methods each class defines itself."""
    out: dict[str, dict] = {}
    for mod, path in files.items():
        t = _tree(path)
        if t is None:
            continue
        names: dict[str, str] = {}                           # local name -> "module.Class" or a module
        for n in t[0].body:
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                for a in n.names:
                    names[a.asname or a.name] = f"{n.module}.{a.name}"
            elif isinstance(n, ast.Import):
                for a in n.names:
                    names[a.asname or a.name] = a.name
        local = {n.name for n in t[0].body if isinstance(n, ast.ClassDef)}
        for n in t[0].body:
            if not isinstance(n, ast.ClassDef):
                continue
            bases = []
            for b in n.bases:
                raw = ast.unparse(b)
                head, _, rest = raw.partition(".")
                if raw in local:
                    bases.append(f"{mod}.{raw}")
                elif raw in names:
                    bases.append(names[raw])
                elif rest and head in names:
                    bases.append(f"{names[head]}.{rest}")
                else:
                    bases.append(raw)
            out[f"{mod}.{n.name}"] = {"bases": bases, "methods": {m.name: m for m in n.body if isinstance(
                m, (ast.FunctionDef, ast.AsyncFunctionDef))}, "module": mod, "name": n.name}
        out.setdefault("__names__", {})[mod] = {**names, **{c: f"{mod}.{c}" for c in local}}
    return out


def mro(index: dict[str, dict], key: str) -> list[str]:
    """Python's C3 linearisation of `key` over the classes in `index` (a base outside it ends its line)."""
    def lin(k: str, seen: tuple = ()) -> list[str]:
        if k not in index or k in seen:
            return [k]
        seqs = [lin(b, seen + (k,)) for b in index[k]["bases"]] + [list(index[k]["bases"])]
        out = [k]
        while any(seqs):
            seqs = [q for q in seqs if q]
            head = next((q[0] for q in seqs if not any(q[0] in r[1:] for r in seqs)), None)
            if head is None:                                  # no consistent order: Python would refuse the class
                raise Drift(f"{index[k]['module']}: class {index[k]['name']} has no consistent method order")
            out.append(head)
            seqs = [q[1:] if q[0] == head else q for q in seqs]
        return out
    return lin(key)


def defining_class(index: dict[str, dict], key: str, method: str) -> str | None:
    """The class (module.Class) whose `method` instances of `key` run, or None when no class in the index has it."""
    return next((k for k in mro(index, key) if k in index and method in index[k]["methods"]), None)


def entry_classes(index: dict[str, dict], path: Path, mod: str) -> list[str]:
    """The classes a SGLang model file registers: `EntryClass = C` or `EntryClass = [C, ...]` ("module.Class")."""
    t = _tree(path)
    if t is None:
        return []
    names = index.get("__names__", {}).get(mod, {})
    out: list[str] = []
    for n in t[0].body:
        if isinstance(n, ast.Assign) and any(getattr(x, "id", None) == "EntryClass" for x in n.targets):
            v = n.value
            elts = v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v]
            out = [names.get(ast.unparse(e), ast.unparse(e)) for e in elts]
        elif isinstance(n, ast.AugAssign) and getattr(n.target, "id", None) == "EntryClass":
            v = n.value
            out += [names.get(ast.unparse(e), ast.unparse(e))
                    for e in (v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v])]
    return out


def sglang_architectures(root: Path) -> dict[str, dict]:
    """Every architecture a SGLang release registers (the EntryClass of each sglang/srt/models file; the registry
    keys it by the class name) -> the file and class whose `set_eagle3_layers_to_capture` it runs (None: no
    EAGLE-3 capture)."""
    models = root / "sglang/srt/models"
    files = {"sglang.srt.models." + ".".join(p.relative_to(models).with_suffix("").parts): p
             for p in sorted(models.rglob("*.py"))}
    index = class_index(files)
    out: dict[str, dict] = {}
    for mod, path in files.items():
        for key in entry_classes(index, path, mod):
            arch = key.rsplit(".", 1)[-1]
            d = defining_class(index, key, "set_eagle3_layers_to_capture")
            where = None
            if d is not None:
                dm = index[d]["module"]
                where = {"file": str(files[dm].relative_to(models)), "class": index[d]["name"]}
            out.setdefault(arch, {"entry": str(path.relative_to(models)), "capture": where})
    return dict(sorted(out.items()))


# ------------------------------------------------------------------------------------------- vLLM

# `if <test>: ... return True` in VllmConfig.use_v2_model_runner -> the name the table's forces_v2 gives it (the
# other forced cases, dspark / DFlash / diffusion targets, are not modelled: they do not concern an EAGLE-3 target)
FORCED_V2 = (
    (r"prefill_context_parallel_size > 1", "prefill context parallelism"),       # 0.27, 0.28 (after the env var)
    (r"attention_config\.hisparse_config is not None", "HiSparse"),               # 0.30+ (before it; =0 -> error)
    (r"\bwatermark_config\b.*is not None", "watermarking"),                       # 0.30+ (before it; overrides =0)
)
ENV_READ = "envs.VLLM_USE_V2_MODEL_RUNNER"


def forced_v2(use: ast.AST | None, version: str) -> tuple[list[str], dict[str, str]]:
    """The conditions that force V2 in `use_v2_model_runner`, in code order, and what VLLM_USE_V2_MODEL_RUNNER=0
    does to each: `env_wins` (checked after the variable is read: =0 gives V1), `error` (checked before it, and
    =0 raises), `overrides` (checked before it, V2 whatever the variable says)."""
    if use is None:
        return [], {}
    fn = ast.parse(text(use)).body[0]
    env_read, forced, env0 = False, [], {}
    for st in fn.body:
        test = ast.unparse(st.test) if isinstance(st, ast.If) else ""
        name = next((n for pat, n in FORCED_V2 if re.search(pat, test)), None)
        if name is None:
            if ENV_READ in ast.unparse(st):
                env_read = True
            continue
        last = st.body[-1]
        if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Constant) and last.value.value is True):
            raise Drift(f"vLLM {version}: vllm/config/vllm.py VllmConfig.use_v2_model_runner checks {name} "
                        f"(`if {test}:`) without returning True at its end; read it and extend forced_v2")
        forced.append(name)
        if env_read:
            env0[name] = "env_wins"
            continue
        veto = [n for b in st.body[:-1] for n in ast.walk(b)
                if isinstance(n, ast.If) and ENV_READ in ast.unparse(n.test)]
        if any(re.search(rf"{re.escape(ENV_READ)} (is False|== False)|not {re.escape(ENV_READ)}", ast.unparse(n.test))
               is None for n in veto):
            raise Drift(f"vLLM {version}: VllmConfig.use_v2_model_runner reads {ENV_READ} inside its {name} check "
                        f"in a way this script cannot parse; read it")
        raises = any(isinstance(x, ast.Raise) for n in veto for x in ast.walk(n))
        env0[name] = "error" if raises else "overrides"
    us = text(use)
    for word, name in (("hisparse", "HiSparse"), ("watermark", "watermarking"),
                       ("prefill_context_parallel", "prefill context parallelism")):
        if word in us and name not in forced:
            raise Drift(f"vLLM {version}: VllmConfig.use_v2_model_runner mentions {word} outside a check this "
                        f"script parses; read it and extend forced_v2")
    return forced, env0

ENV_VALUES_WORDS = {"integer": "bool(int(value)): an integer, 0 -> V1, any other -> V2; true/false or an empty value "
                                "make vLLM raise ValueError"}


def env_values(envs: Path, version: str) -> tuple[str, dict[str, str | None], str]:
    """How vllm/envs.py parses VLLM_USE_V2_MODEL_RUNNER: ("integer" for `bool(int(...))`, directly or through
    `maybe_convert_bool`), the hashes of the code read, and where it is decided."""
    t = _tree(envs)
    lam = None
    for n in ast.walk(t[0]) if t else []:
        if isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if isinstance(k, ast.Constant) and k.value == "VLLM_USE_V2_MODEL_RUNNER" and isinstance(v, ast.Lambda):
                    lam = v
    if lam is None:
        raise Drift(f"vLLM {version}: vllm/envs.py has no VLLM_USE_V2_MODEL_RUNNER lambda; read how it is parsed")
    body = ast.unparse(lam.body)
    getenv = r"os\.getenv\('VLLM_USE_V2_MODEL_RUNNER', ('0'|None)\)"
    if re.fullmatch(rf"bool\(int\({getenv}\)\)", body):
        return "integer", {}, f"vllm/envs.py: VLLM_USE_V2_MODEL_RUNNER ({body})"
    m = re.fullmatch(rf"(\w+)\({getenv}\)", body)
    conv = find(envs, m.group(1)) if m else None
    if conv is not None:
        fn = ast.parse(text(conv)).body[0]
        arg = fn.args.args[0].arg
        want = f"if {arg} is None:\n    return None\nreturn bool(int({arg}))"
        if "\n".join(ast.unparse(st) for st in fn.body) == want:
            return ("integer", {f"vllm/envs.py:{conv.name}": digest(conv)},
                    f"vllm/envs.py: VLLM_USE_V2_MODEL_RUNNER ({conv.name}: bool(int(value)))")
    raise Drift(f"vLLM {version}: vllm/envs.py parses VLLM_USE_V2_MODEL_RUNNER as `{body}`, which this script "
                f"cannot read; read it and extend env_values (backend/vllm_runner.py accepts what it says)")


def deepseek_architectures(path: Path) -> list[str]:
    """The classes of vLLM's deepseek_v2.py that run DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers
    (it or a subclass in the file that does not override it). Subclasses in other files are not read."""
    mod = "vllm.model_executor.models.deepseek_v2"
    index = class_index({mod: path})
    base = f"{mod}.DeepseekV2ForCausalLM"
    return sorted(index[k]["name"] for k in index if k != "__names__" and base in mro(index, k)
                  and defining_class(index, k, "get_eagle3_aux_hidden_state_layers") == base)


def derive_vllm(root: Path, version: str) -> dict:
    f = {k: root / v for k, v in VLLM_FILES.items()}
    use = find(f["config"], "VllmConfig.use_v2_model_runner")
    isdef = find(f["config"], "VllmConfig._is_default_v2_model_runner_model")
    unsup = find(f["config"], "VllmConfig._get_v2_model_runner_unsupported_features")
    v1 = find(f["v1"], "GPUModelRunner._get_eagle3_aux_layers_from_config")
    v2 = find(f["v2"], "get_eagle3_aux_layers_from_config")
    dflt = find(f["iface"], "SupportsEagle3.get_eagle3_default_aux_hidden_state_layers")
    ds = find(f["deepseek"], "DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers")
    fwd = find(f["llama"], "LlamaModel.forward")
    envs_src = f["envs"].read_text() if f["envs"].exists() else ""
    cfg = "vllm/config/vllm.py"
    code, decided = {}, {}

    def cite(key: str, file: str, qual: str, node) -> None:
        decided[key] = f"{file}: {qual}"
        code[f"{file}:{qual}"] = digest(node)

    # runner choice
    rc: dict = {"env": "VLLM_USE_V2_MODEL_RUNNER"}
    m = re.search(r'"VLLM_USE_V2_MODEL_RUNNER":\s*lambda:\s*(.*?)\n\s*\),?\n', envs_src, re.S)
    env_expr = m.group(1) if m else ""
    if use is None:
        rc.update(auto=False, default="v1" if '"0"' in env_expr else "unknown", v2_architectures=[],
                  selection="env_only", unsupported=appended_features(find(f["config"],
                                                                            "VllmConfig._validate_v2_model_runner")))
        cite("runner", cfg, "VllmConfig.__post_init__ (envs.VLLM_USE_V2_MODEL_RUNNER, default 0)", None)
        code.pop(f"{cfg}:VllmConfig.__post_init__ (envs.VLLM_USE_V2_MODEL_RUNNER, default 0)")
        decided["runner"] = ("vllm/envs.py: VLLM_USE_V2_MODEL_RUNNER (bool(int(os.getenv(..., '0')))); "
                             "no automatic choice")
        code["vllm/envs.py:VLLM_USE_V2_MODEL_RUNNER"] = hashlib.sha256(env_expr.encode()).hexdigest()[:12]
    else:
        us = text(use)
        rc["auto"] = True
        rc["default"] = "auto"
        calls_isdef = "_is_default_v2_model_runner_model" in us
        archs = module_constant(f["config"], "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES") or []
        if not calls_isdef:
            rc["selection"] = "all"
            rc["v2_architectures"] = []
        else:
            s = text(isdef)
            if "or not model_config.is_moe" in s:
                rc["selection"] = "listed_or_dense"
            elif re.search(r"not model_config\.is_moe and \(?not model_config\.is_quantized", s):
                rc["selection"] = "listed_dense_unquantized"
            elif "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES" in s or "default_v2_model_runner_architectures" in s:
                rc["selection"] = "listed"
            else:
                raise Drift(f"vLLM {version}: {cfg} VllmConfig._is_default_v2_model_runner_model decides in a way "
                            f"this script cannot parse; read it and extend derive_vllm")
            rc["v2_architectures"] = archs
            rc["hybrid_v1"] = "is_hybrid" in s
            cite("runner_default_model", cfg, "VllmConfig._is_default_v2_model_runner_model", isdef)
        forced, env0 = forced_v2(use, version)
        rc["forces_v2"] = forced
        if env0:
            rc["forces_v2_env0"] = env0
        rc["unsupported"] = appended_features(unsup)
        cite("runner", cfg, "VllmConfig.use_v2_model_runner", use)
        cite("runner_unsupported", cfg, "VllmConfig._get_v2_model_runner_unsupported_features", unsup)

    rc["env_values"], env_code, decided["env_values"] = env_values(f["envs"], version)
    code.update(env_code)
    code.setdefault("vllm/envs.py:VLLM_USE_V2_MODEL_RUNNER", hashlib.sha256(env_expr.encode()).hexdigest()[:12])

    # where ids are read
    def reading(node, who: str) -> str:
        s = text(node)
        if not s:
            raise Drift(f"vLLM {version}: {who} not found; the table cites it")
        nested_ids = re.search(r"eagle_config\.get\(\s*'eagle_aux_hidden_state_layer_ids'", s)
        nested_layer_ids = "'eagle_config'" in s and re.search(r"\.get\(\s*'layer_ids'", s)
        if "'eagle_aux_hidden_state_layer_ids'" not in s:
            raise Drift(f"vLLM {version}: {who} no longer reads eagle_aux_hidden_state_layer_ids")
        if nested_ids:
            return "top_then_nested"
        if nested_layer_ids:
            return "top_then_nested_layer_ids"
        return "top_level"

    ids_from = {"v1": reading(v1, "V1 _get_eagle3_aux_layers_from_config"),
                "v2": reading(v2, "V2 get_eagle3_aux_layers_from_config")}
    cite("ids_v1", VLLM_FILES["v1"], "GPUModelRunner._get_eagle3_aux_layers_from_config", v1)
    cite("ids_v2", VLLM_FILES["v2"], "get_eagle3_aux_layers_from_config", v2)

    default = expr_in_n(text(dflt))
    ds_default = expr_in_n(text(ds))
    if default is None or ds_default is None:
        raise Drift(f"vLLM {version}: the default aux layers are no longer (2, N//2, N-3); read "
                    f"{VLLM_FILES['iface']} and {VLLM_FILES['deepseek']}")
    cite("default", VLLM_FILES["iface"], "SupportsEagle3.get_eagle3_default_aux_hidden_state_layers", dflt)
    cite("default_deepseek", VLLM_FILES["deepseek"], "DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers", ds)

    fs = text(fwd)
    if re.search(r"_maybe_add_hidden_state\(\s*aux_hidden_states,\s*idx \+ 1", fs) or \
            re.search(r"if idx in self\.aux_hidden_state_layers:\s*\n\s*aux_hidden_states\.append\(hidden_states "
                      r"\+ residual\)\s*\n\s*(hidden_states, residual|hidden_states) = layer\(", fs):
        rule = "input"
    else:
        raise Drift(f"vLLM {version}: {VLLM_FILES['llama']} LlamaModel.forward captures aux states in a way this "
                    f"script cannot parse; read it (is id a still the input of layer a?)")
    cite("rule", VLLM_FILES["llama"], "LlamaModel.forward", fwd)
    return {"engine": "vllm", "version": version, "wheel_sha256": (root / "WHEEL_SHA256").read_text().strip(),
            "rule": rule, "default": default, "default_deepseek": ds_default,
            "deepseek_architectures": deepseek_architectures(f["deepseek"]), "ids_from": ids_from,
            "runner_choice": rc, "decided_by": decided, "code": code}


# ------------------------------------------------------------------------------------------- SGLang

def _functions(path: Path):
    t = _tree(path)
    if t is None:
        return
    for n in t[0].body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield n.name, n
        elif isinstance(n, ast.ClassDef):
            for m in n.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{n.name}.{m.name}", m


def sglang_rule(node) -> tuple[str, list[str] | None]:
    s = text(node)
    if not s:
        return "unsupported", None
    d = expr_in_n(s)
    if "layer_ids[0] == 1" in s:
        return "after_if_first_1", d
    if re.search(r"max\(layer_ids\)\s*==", s):
        return "input_if_max_n", d
    if re.search(r"\[\s*val \+ 1 for val in layer_ids\s*\]", s):
        return "after", d
    if re.search(r"layers_to_capture = (list\()?layer_ids\)?\s*$", s, re.M):
        return "input", d
    return "unparsed", d


def derive_sglang(root: Path, version: str) -> dict:
    code, decided = {}, {}
    # where eagle_config is read: the model_executor function indexing eagle_config[...ids]
    where = None
    for path in sorted((root / "sglang/srt/model_executor").rglob("*.py")):
        for qual, node in _functions(path):
            s = text(node)
            if re.search(r"eagle_config\[\s*'eagle_aux_hidden_state_layer_ids'\s*\]", s):
                rel = str(path.relative_to(root))
                top = re.search(r"getattr\([^)]*hf_config,\s*'eagle_aux_hidden_state_layer_ids'", s)
                where = ("nested_then_top" if top else "nested", rel, qual, node)
                break
        if where:
            break
    if where is None:
        raise Drift(f"SGLang {version}: no sglang/srt/model_executor function reads "
                    f"eagle_config['eagle_aux_hidden_state_layer_ids'] any more; read how it finds the ids")
    ids_from, rel, qual, node = where
    decided["ids"] = f"{rel}: {qual}"
    code[f"{rel}:{qual}"] = digest(node)
    families = {}
    for fam, fname in SGLANG_MODEL_FILES.items():
        path = root / "sglang/srt/models" / fname
        hit = None
        for q, n in _functions(path):
            if q.endswith(".set_eagle3_layers_to_capture") and "ForCausalLM" in q.split(".")[0]:
                hit = (q, n)
                break
        if hit is None:
            families[fam] = {"rule": "unsupported", "default": None,
                             "decided_by": f"sglang/srt/models/{fname}: no *ForCausalLM.set_eagle3_layers_to_capture"
                             + ("" if path.exists() else " (no such file)")}
            continue
        rule, d = sglang_rule(hit[1])
        if rule == "unparsed":
            raise Drift(f"SGLang {version}: sglang/srt/models/{fname} {hit[0]} maps ids in a way this script "
                        f"cannot parse; read it")
        key = f"sglang/srt/models/{fname}:{hit[0]}"
        families[fam] = {"rule": rule, "default": d, "decided_by": f"sglang/srt/models/{fname}: {hit[0]}",
                         "code": {key: digest(hit[1])}}
    # which architectures take which capture: EntryClass of every model file, then the class's method order
    archs, registered = {}, sglang_architectures(root)
    for arch, d in registered.items():
        c = d["capture"]
        if c is None:
            continue
        rule, _ = sglang_rule(find(root / "sglang/srt/models" / c["file"],
                                   f"{c['class']}.set_eagle3_layers_to_capture"))
        archs[arch] = {"entry": d["entry"], "capture": f"{c['file']}: {c['class']}", "rule": rule}
    # a family file whose registered class inherits its capture from another file (SGLang 0.5.8:
    # Glm4MoeLiteForCausalLM(DeepseekV2ForCausalLM)) takes that class's rule
    for fam, fname in SGLANG_MODEL_FILES.items():
        a = archs.get(MODEL_TYPE_ARCH.get(fam, ""))
        if a is None or a["capture"].split(": ")[0] == fname:
            continue
        cfile, ccls = a["capture"].split(": ")
        node = find(root / "sglang/srt/models" / cfile, f"{ccls}.set_eagle3_layers_to_capture")
        rule, d = sglang_rule(node)
        families[fam] = {"rule": rule, "default": d,
                         "decided_by": f"sglang/srt/models/{cfile}: {ccls}.set_eagle3_layers_to_capture (inherited by "
                                       f"{fname} {MODEL_TYPE_ARCH[fam]})",
                         "code": {f"sglang/srt/models/{cfile}:{ccls}.set_eagle3_layers_to_capture": digest(node)}}
    for fam, fname in SGLANG_MODEL_FILES.items():
        if "inherited by" in families[fam]["decided_by"]:
            continue
        want = families[fam]["decided_by"].split(": ", 1)[-1]
        if families[fam]["rule"] != "unsupported" and not any(
                a["capture"] == f"{fname}: {want.rsplit('.', 1)[0]}" for a in archs.values()):
            raise Drift(f"SGLang {version}: no EntryClass architecture runs sglang/srt/models/{fname} {want}; "
                        f"read which class the file registers")
    # --enable-return-aux-hidden-states (aux capture on a target without a drafter): where model_executor resolves it
    flag = any("return_aux_hidden_state_layer_ids" in p.read_text()
               for p in (root / "sglang/srt/model_executor").rglob("*.py"))
    return {"engine": "sglang", "version": version, "wheel_sha256": (root / "WHEEL_SHA256").read_text().strip(),
            "ids_from": ids_from, "families": families, "architectures": archs,
            "n_architectures": len(registered), "return_aux_hidden_states_flag": flag,
            "decided_by": decided, "code": code}


# ------------------------------------------------------------------------------------------- facts -> rows

def _minor(v: str) -> str:
    return ".".join(v.split(".")[:2])


def _next_minor(v: str) -> str:
    a, b = v.split(".")[:2]
    return f"{a}.{int(b) + 1}"


def _next_patch(v: str) -> str:
    a, b, c = v.split(".")[:3]
    return f"{a}.{b}.{int(c) + 1}"


def vllm_rows(facts: list[dict]) -> list[dict]:
    """One row per (minor release, family group); the patch releases of a minor must agree."""
    by_minor: dict[str, list[dict]] = {}
    for f in facts:
        by_minor.setdefault(_minor(f["version"]), []).append(f)
    rows = []
    for minor, fs in by_minor.items():
        first = fs[0]
        for other in fs[1:]:
            for k in ("rule", "default", "default_deepseek", "deepseek_architectures", "ids_from", "runner_choice"):
                if other[k] != first[k]:
                    raise Drift(f"vLLM {other['version']} differs from {first['version']} in {k}: "
                                f"{other[k]} vs {first[k]}; split the {minor} row")
        wheels = {f["version"]: {"sha256": f["wheel_sha256"], "code": f["code"]} for f in fs}
        ds_archs = first.get("deepseek_architectures")
        if ds_archs is None:
            raise Drift(f"vLLM {first['version']}: the facts hold no deepseek_architectures; re-read the wheel")
        for mt, arch in MODEL_TYPE_ARCH.items():
            if (arch in ds_archs) != (mt in VLLM_DEEPSEEK_FAMILIES):
                raise Drift(f"vLLM {first['version']}: {arch} (model_type {mt}) "
                            + ("runs" if arch in ds_archs else "does not run")
                            + " DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers (deepseek_v2.py), but the "
                            f"table's DeepSeek families are {list(VLLM_DEEPSEEK_FAMILIES)}; fix VLLM_DEEPSEEK_FAMILIES")
        for fams, dkey, valid in ((list(VLLM_DEEPSEEK_FAMILIES), "default_deepseek",
                                   VALID[("vllm", "input", "deepseek")]),
                                  (["*"], "default", VALID[("vllm", "input", "*")])):
            decided = {k: v for k, v in first["decided_by"].items()
                       if k != ("default" if dkey == "default_deepseek" else "default_deepseek")}
            rows.append({
                "producer": "vllm", "versions": f">={minor},<{_next_minor(minor)}", "runner": list(VLLM_RUNNERS),
                "families": fams, **({"architectures": ds_archs} if dkey == "default_deepseek" else {}),
                "rule": first["rule"], "valid": valid, "default": first[dkey], "teacher": "none",
                "ids_from": first["ids_from"], "runner_choice": first["runner_choice"], "decided_by": decided,
                "wheels": {v: {"sha256": w["sha256"], "code": {
                    k: h for k, h in w["code"].items()
                    if not (dkey == "default" and "deepseek_v2.py" in k)
                    and not (dkey == "default_deepseek" and "interfaces.py" in k)}}
                           for v, w in wheels.items()},
                "status": "inferred",
            })
    return rows


def group_architectures(f: dict) -> tuple[dict[str, list[str]], list[str]]:
    """Per SGLANG_GROUPS file: the architectures whose set_eagle3_layers_to_capture comes from it (the catch-all:
    from llama.py or the qwen files), and the catch-all's families (MODEL_TYPE_ARCH) whose architecture has no
    capture in this release (they get a row of their own, rule unsupported). Raises Drift when a family's
    architecture is served elsewhere than where the table's family lists (SGLANG_GROUPS) put it."""
    files = {src: ([f"{x}.py" for x in SGLANG_CATCH_ALL_FILES] if fams == ("*",) else [f"{src}.py"])
             for fams, src in SGLANG_GROUPS}
    for fams, src in SGLANG_GROUPS:                     # a capture inherited from another file's class
        if fams != ("*",) and "inherited by" in f["families"][src]["decided_by"]:
            files[src] = [f["families"][src]["decided_by"].split(": ")[0].split("/")[-1]]
    archs = f.get("architectures")
    if archs is None:                                   # facts stored before the architectures were read
        raise Drift(f"SGLang {f['version']}: the facts hold no architectures; re-read the wheel")
    served = {src: sorted(a for a, d in archs.items() if d["capture"].split(": ")[0] in fs)
              for src, fs in files.items()}
    for fams, src in SGLANG_GROUPS:                     # an inherited capture: the group's own architectures only
        if fams != ("*",) and "inherited by" in f["families"][src]["decided_by"]:
            own = f["families"][src]["decided_by"].split("inherited by ")[1].split(" ")[0]
            served[src] = sorted(a for a, d in archs.items() if d["entry"] == own)
    uncaptured = []
    for mt, arch in MODEL_TYPE_ARCH.items():
        fams, src = next(((g, s) for g, s in SGLANG_GROUPS if mt in g), SGLANG_GROUPS[-1])
        d = archs.get(arch)
        if d is None:
            if fams == ("*",):
                uncaptured.append(mt)
            elif f["families"][src]["rule"] != "unsupported":
                raise Drift(f"SGLang {f['version']}: {arch} (model_type {mt}) has no set_eagle3_layers_to_capture, "
                            f"but the table's {list(fams)} row gives it rule {f['families'][src]['rule']}")
            continue
        if d["capture"].split(": ")[0] not in files[src]:
            home = next((s for s, fs in files.items() if d["capture"].split(": ")[0] in fs), None)
            raise Drift(f"SGLang {f['version']}: {arch} (model_type {mt}) takes set_eagle3_layers_to_capture from "
                        f"{d['capture']}, but SGLANG_GROUPS puts {mt} in the {list(fams)} row"
                        + (f"; move it to the {home} group" if home else "; give it its own group"))
    return served, uncaptured


def sglang_rows(facts: list[dict]) -> list[dict]:
    rows = []
    for f in facts:
        fam = f["families"]
        qwen = {k: fam[k] for k in ("qwen3", "qwen3_moe", "qwen2") if fam[k]["rule"] != "unsupported"}
        for k, q in qwen.items():
            if (q["rule"], q["default"]) != (fam["llama"]["rule"], fam["llama"]["default"]):
                raise Drift(f"SGLang {f['version']}: {k} ({q['rule']}) differs from llama ({fam['llama']['rule']}); "
                            f"give the qwen family its own row")
        served, uncaptured = group_architectures(f)
        base = {"producer": "sglang", "versions": f">={f['version']},<{_next_patch(f['version'])}"}
        for fams, src in SGLANG_GROUPS:
            d = fam[src]
            code = dict(f["code"])
            code.update(d.get("code", {}))
            decided = {"ids": f["decided_by"]["ids"], "rule": d["decided_by"]}
            if src == "llama":
                for q in qwen.values():
                    code.update(q["code"])
                same = [SGLANG_MODEL_FILES[k] for k in ("qwen3", "qwen3_moe", "qwen2") if k in qwen]
                decided["rule"] += f" ({', '.join(same)}: the same)" if same else ""
            if fams == ("*",) and uncaptured:
                where = "; ".join(
                    f"{MODEL_TYPE_ARCH[mt]} ({mt}): no set_eagle3_layers_to_capture in its class or bases"
                    for mt in uncaptured)
                rows.append({**base, "families": uncaptured, "architectures": [], "rule": "unsupported",
                             "valid": VALID[("sglang", "unsupported")], "default": [], "teacher": "none",
                             "ids_from": {"any": f["ids_from"]},
                             "decided_by": {"ids": f["decided_by"]["ids"],
                                            "rule": f"sglang/srt/models (EntryClass): {where}"},
                             "return_aux_hidden_states_flag": f["return_aux_hidden_states_flag"],
                             "wheels": {f["version"]: {"sha256": f["wheel_sha256"], "code": dict(f["code"])}},
                             "status": "inferred"})
            row = {**base, "families": list(fams), "architectures": served[src], "rule": d["rule"],
                   "valid": VALID[("sglang", d["rule"])],
                   "default": d["default"] or [], "teacher": "none",
                   "ids_from": {"any": f["ids_from"]}, "decided_by": decided,
                   "return_aux_hidden_states_flag": f["return_aux_hidden_states_flag"],
                   "wheels": {f["version"]: {"sha256": f["wheel_sha256"], "code": code}}, "status": "inferred"}
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------- drafter config fields

# Which EAGLE-3 drafter config fields each release honours (issue 22 item 3), written to backend/drafter_fields.yaml
# (--fields). Read in every `*eagle3*.py` drafter model file of the release (vllm/model_executor/models/,
# sglang/srt/models/); the lint uses the rows of the Llama drafter file, the one SpecLens's three formats load.
# A release honours a field when a function of the file reads its key from the config (a "key" string constant, or
# `<...config>.key`) and a function other than __init__/load_weights applies the module the field builds (calls or
# iterates `<...>.module`, or is that module, e.g. vLLM's `_norm_before_residual`), or branches on the key itself.
FIELDS_TABLE = REPO / "backend" / "drafter_fields.yaml"
DRAFTER_FIELDS = {"norm_before_fc": "input_norm", "fc_norm": "fc_norm", "use_aux_norm": "fc_norm",
                  "norm_before_residual": "_norm_before_residual"}
LLAMA_DRAFTER = {"vllm": "vllm/model_executor/models/llama_eagle3.py", "sglang": "sglang/srt/models/llama_eagle3.py"}
MODELS_DIR = {"vllm": "vllm/model_executor/models", "sglang": "sglang/srt/models"}
_NOT_APPLYING = ("__init__", "load_weights")


def _qual_functions(tree: ast.Module):
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield n.name, n
        elif isinstance(n, ast.ClassDef):
            for m in n.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{n.name}.{m.name}", m


def _reads_key(node: ast.AST, key: str) -> bool:
    for x in ast.walk(node):
        if isinstance(x, ast.Constant) and x.value == key:
            return True
        if isinstance(x, ast.Attribute) and x.attr == key and "config" in ast.unparse(x.value).lower():
            return True
    return False


def _uses_module(qual: str, node: ast.AST, module: str) -> bool:
    if qual.rsplit(".", 1)[-1] == module:
        return True
    return any(isinstance(x, ast.Attribute) and x.attr == module and isinstance(x.ctx, ast.Load)
               for x in ast.walk(node))


def _site(funcs: list[tuple[str, ast.AST]], field: str) -> str | None:
    """Where the field would act: the function building fc (the norms before fc), or the one setting the first
    layer's residual from the fc output (norm_before_residual)."""
    for q, n in funcs:
        for x in ast.walk(n):
            if not isinstance(x, ast.Assign):
                continue
            t = [ast.unparse(t) for t in x.targets]
            if field != "norm_before_residual" and "self.fc" in t:
                return q
            if field == "norm_before_residual" and "residual" in t and ast.unparse(x.value) == "hidden_states":
                return q
    return None


def entry_names(tree: ast.Module) -> list[str]:
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in n.targets):
            v = n.value
            return [e.id for e in (v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v]) if isinstance(e, ast.Name)]
    return []


def derive_fields(engine: str, root: Path, version: str) -> list[dict]:
    """One fact per (drafter file, field) of the release: honoured or ignored, and the functions that say so."""
    out = []
    files = sorted(p for p in (root / MODELS_DIR[engine]).glob("*eagle3*.py"))
    if not (root / LLAMA_DRAFTER[engine]).exists():
        raise Drift(f"{engine} {version}: no {LLAMA_DRAFTER[engine]} in the wheel")
    for path in files:
        tree, _ = _tree(path)
        rel = str(path.relative_to(root))
        funcs = list(_qual_functions(tree))
        for field, module in DRAFTER_FIELDS.items():
            reads = [q for q, n in funcs if _reads_key(n, field)]
            applies = [q for q, n in funcs if q.rsplit(".", 1)[-1] not in _NOT_APPLYING
                       and (_uses_module(q, n, module) or _reads_key(n, field))]
            honoured = bool(reads and applies)
            cited = sorted(set(reads + applies)) if honoured else [s for s in [_site(funcs, field)] if s]
            out.append(dict(engine=engine, version=version, file=rel, architectures=entry_names(tree), field=field,
                            status="honoured" if honoured else "ignored", reads=reads if honoured else [],
                            applies=applies if honoured else [],
                            code={f"{rel}:{q}": digest(find(path, q)) for q in cited}))
    return out


def _fields_decided_by(f: dict) -> str:
    if f.get("decided_by"):                            # MORE_FIELDS facts word their own (derive_more_fields)
        return f["decided_by"]
    if f["status"] == "honoured":
        return (f"{f['file']}: {', '.join(f['reads'])} reads {f['field']}; {', '.join(f['applies'])} applies "
                f"{DRAFTER_FIELDS[f['field']]}")
    site = next(iter(f["code"]), f"{f['file']}:").split(":", 1)[1]
    what = ("builds no input_norm" if f["field"] == "norm_before_fc" else
            "builds no fc_norm" if f["field"] in ("fc_norm", "use_aux_norm") else
            "takes the un-normed fc output as the residual")
    return f"{f['file']}: no function reads {f['field']}; {site or 'the model'} {what}"


def fields_rows(facts: list[dict], releases: dict[str, list[str]]) -> list[dict]:
    """Consecutive releases whose facts agree (status and cited functions) share a row; `versions` runs from the
    first to the next derived release (post releases of the last one included)."""
    rows: list[dict] = []
    key = lambda f: (f["engine"], f["file"], f["field"])  # noqa: E731
    groups: dict[tuple, list[dict]] = {}
    for f in facts:
        groups.setdefault(key(f), []).append(f)
    for (eng, file, field), fs in groups.items():
        order = releases[eng]
        fs = sorted(fs, key=lambda f: order.index(f["version"]))
        cur: dict | None = None
        for f in fs:
            sig = (f["status"], f["reads"], f["applies"], sorted(f["code"]), f["architectures"])
            i = order.index(f["version"])
            if cur is not None and cur["_sig"] == sig and order.index(cur["releases"][-1]) == i - 1:
                cur["releases"].append(f["version"])
                cur["wheels"][f["version"]] = f["code"]
                continue
            cur = dict(_sig=sig, engine=eng, field=field, status=f["status"], file=file,
                       architectures=f["architectures"], releases=[f["version"]], decided_by=_fields_decided_by(f),
                       wheels={f["version"]: f["code"]})
            rows.append(cur)
    for r in rows:
        order = releases[r["engine"]]
        last = order.index(r["releases"][-1])
        hi = order[last + 1] if last + 1 < len(order) else _next_patch(r["releases"][-1])
        r["versions"] = f">={r['releases'][0]},<{hi}"
        del r["_sig"]
    keys = ("engine", "versions", "field", "status", "file", "architectures", "decided_by", "releases", "wheels")
    rows = [{k: r[k] for k in keys} for r in rows]
    eng_order = {"vllm": 0, "sglang": 1}
    return sorted(rows, key=lambda r: (eng_order[r["engine"]], r["file"] != LLAMA_DRAFTER[r["engine"]], r["file"],
                                       _field_order(r["field"]), _vkey(r["versions"])))


FIELDS_HEAD = """\
# Which EAGLE-3 drafter config fields each vLLM / SGLang release honours or ignores, derived from the released wheels
# by tools/rederive_conventions.py --fields --write (do not edit by hand; run it again after a new release).
# One row per (engine, drafter model file, field, run of consecutive releases that agree):
#   status: honoured (a function of the file reads the key and another applies what it builds) | ignored (no
#     function reads the key: a drafter trained with it set is served without it)
#   file: the drafter model file read (every *eagle3*.py of the release); architectures: its EntryClass (SGLang)
#     or its classes serving it (vLLM: empty, the registry maps LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM to
#     llama_eagle3.py); the lint (backend/drafter/lint.py) reads the llama_eagle3.py rows.
#   decided_by: the functions that read and apply it (honoured) or where it would act (ignored);
#   releases: the wheels read; wheels: per release, the hash of each cited function (the tool fails on a change).
# Fields: norm_before_fc (one input_norm over the concatenated aux states), fc_norm / use_aux_norm (SGLang's legacy
#   key; a per-aux-chunk fc_norm), norm_before_residual (vLLM: the first layer's residual is the normed fc output);
#   for the Llama drafter file only (MORE_FIELDS, read with the llama.py classes it builds on and, for vLLM, the rope
#   loader vllm/transformers_utils/config.py:patch_rope_parameters): draft_vocab_size, d2t (the checkpoint tensor),
#   target_hidden_size, rope_theta, rope_scaling, sliding_window, tie_word_embeddings, head_dim. The aux-id keys are
#   the `ids_from` of backend/conventions.yaml's rows (not repeated here).
# Releases not listed (older or newer than the rows) are not derived: the lint reports no field finding for them.
"""


def fields_main(a, engines: list[str], cache: Path) -> int:
    releases = RELEASES
    facts: list[dict] = []
    derived = {e: [] for e in RELEASES}
    for eng in engines:
        rels = [r for r in releases[eng] if not a.releases or r in a.releases]
        for v in rels:
            root = sources(eng, v, cache)
            facts += derive_fields(eng, root, v)
            rope_loader(eng, v, root)
            facts += derive_more_fields(eng, root, v)
            derived[eng].append(v)
            print(f"{eng} {v}: drafter fields read", file=sys.stderr)
    rows = fields_rows(facts, releases)
    if a.json:
        Path(a.json).write_text(json.dumps(facts, indent=1) + "\n")
    old = yaml.safe_load(FIELDS_TABLE.read_text()) if FIELDS_TABLE.exists() else []
    if a.write:
        keep = [r for r in old or [] if r["engine"] not in engines]
        allrows = sorted(rows + keep, key=lambda r: ({"vllm": 0, "sglang": 1}[r["engine"]],
                                                       r["file"] != LLAMA_DRAFTER[r["engine"]], r["file"],
                                                       _field_order(r["field"]), _vkey(r["versions"])))
        FIELDS_TABLE.write_text(FIELDS_HEAD + yaml.safe_dump(allrows, sort_keys=False, width=120))
        print(f"wrote {len(rows)} derived rows to {FIELDS_TABLE.relative_to(REPO)}")
        return 0
    diffs = compare_fields(facts, old or [])
    if diffs:
        print(f"FAIL: {len(diffs)} difference(s) between the wheels and {FIELDS_TABLE.relative_to(REPO)}:")
        for d in diffs:
            print("  " + d)
        return 1
    print(f"OK: {', '.join(f'{e} {len(derived[e])} release(s)' for e in engines)} agree with "
          f"{FIELDS_TABLE.relative_to(REPO)} ({len(facts)} facts)")
    return 0


def compare_fields(facts: list[dict], table: list[dict]) -> list[str]:
    """Each derived fact against the table row holding its release: status, and the hash of each cited function."""
    out = []
    for f in facts:
        row = next((r for r in table if r["engine"] == f["engine"] and r["file"] == f["file"]
                    and r["field"] == f["field"] and f["version"] in r["releases"]), None)
        name = f"{f['engine']} {f['version']} {f['file']} {f['field']}"
        if row is None:
            out.append(f"{name}: no row (run --fields --write)")
        elif row["status"] != f["status"]:
            out.append(f"{name}: the wheel says {f['status']}, the table {row['status']}")
        elif row["wheels"].get(f["version"]) != f["code"]:
            out.append(f"{name}: cited code differs: wheel {f['code']}, table {row['wheels'].get(f['version'])}")
    return out


# ------------------------------------------------------------------------------------------- more drafter fields

# The other drafter config fields issue 22 names (draft vocab / d2t, target_hidden_size, rope, sliding window, tied
# embeddings, head_dim), read in the Llama drafter file (LLAMA_DRAFTER, the one the lint uses) together with the code
# of the target-model file it builds on (`from ...models.llama import LlamaDecoderLayer, ...`): the methods of those
# base classes the drafter's classes do not override (plus a base __init__ reached through super().__init__), and the
# classes those __init__s construct (LlamaAttention, LlamaMLP), which is where rope, head_dim and the window act. For
# vLLM also the config loader's `patch_rope_parameters` (vllm/transformers_utils/config.py), which turns rope_theta /
# rope_scaling into the rope_parameters the attention reads. A field is honoured when a function in that scope reads
# one of its keys from the config (or, for d2t, the checkpoint tensor name) and a function in that scope uses what it
# sets (the `uses` names below); ignored when no function reads any of its keys.
MORE_FIELDS = {  # field -> (keys read, names a function uses to apply it, what is built from it)
    "draft_vocab_size": (("draft_vocab_size",), ("lm_head", "logits_processor"), "the LM head's rows"),
    "d2t": (("d2t",), ("draft_id_to_target_id", "hot_token_id"), "the draft-to-target id map"),
    "target_hidden_size": (("target_hidden_size",), ("fc",), "fc's input width"),
    "rope_theta": (("rope_theta", "rope_parameters"), ("get_rope",), "the rotary embedding's base"),
    "rope_scaling": (("rope_scaling", "rope_parameters"), ("get_rope",), "the rotary embedding's scaling"),
    "sliding_window": (("sliding_window",), ("per_layer_sliding_window", "sliding_window_size"),
                       "the attention window"),
    "tie_word_embeddings": (("tie_word_embeddings",), ("lm_head",), "the LM head shared with embed_tokens"),
    "head_dim": (("head_dim",), ("head_dim",), "the attention head width"),
}
VLLM_ROPE_LOADER = ("vllm/transformers_utils/config.py", "patch_rope_parameters")


def _field_order(field: str) -> int:
    return (list(DRAFTER_FIELDS) + list(MORE_FIELDS)).index(field)


def rope_loader(engine: str, version: str, root: Path, pip: str = sys.executable) -> Path | None:
    """vLLM's config loader file, extracted beside the model files from the same wheel (its sha256 checked)."""
    if engine != "vllm":
        return None
    f = root / VLLM_ROPE_LOADER[0]
    if f.exists():
        return f
    with tempfile.TemporaryDirectory(prefix="wheel-vllm-") as tmp:
        r = subprocess.run([pip, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"vllm=={version}",
                            "-d", tmp, "-q"], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            raise SystemExit(f"pip download vllm=={version} failed: {(r.stderr or r.stdout).strip()[-400:]}")
        h = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        if (root / "WHEEL_SHA256").read_text().strip() != h:
            raise SystemExit(f"vllm=={version}: the wheel downloaded now (sha256 {h[:12]}) is not the one cached "
                             f"in {root}; read what changed")
        with zipfile.ZipFile(wheels[0]) as z:
            z.extract(VLLM_ROPE_LOADER[0], root)
    return f


def _names_used(node: ast.AST) -> set[str]:
    """Names and attribute names a function loads or calls, and the keyword names it passes."""
    out: set[str] = set()
    for x in ast.walk(node):
        if isinstance(x, ast.Name):
            out.add(x.id)
        elif isinstance(x, ast.Attribute):
            out.add(x.attr)
        elif isinstance(x, ast.keyword) and x.arg:
            out.add(x.arg)
    return out


def field_scope(engine: str, root: Path) -> list[tuple[str, str, ast.AST]]:
    """(file, qualified name, function) of every function that runs when the Llama drafter is built and served:
    the drafter file's, the base-module methods its classes inherit or reach through super().__init__, the classes
    those __init__s construct, and (vLLM) the rope loader."""
    dfile = root / LLAMA_DRAFTER[engine]
    base_rel = f"{MODELS_DIR[engine]}/llama.py"
    tree, _ = _tree(dfile)
    out = [(LLAMA_DRAFTER[engine], q, n) for q, n in _qual_functions(tree)]
    imported = {a.asname or a.name: a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module
                and (n.module.endswith("models.llama") or (n.level == 1 and n.module == "llama")) for a in n.names}
    for n in ast.walk(tree):                          # `Base = LlamaDecoderLayer` (vLLM 0.30+: outside TYPE_CHECKING)
        if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id in imported
                and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)):
            imported[n.targets[0].id] = imported[n.value.id]
    bt = _tree(root / base_rel)
    if bt is not None:
        base_classes = {n.name: n for n in bt[0].body if isinstance(n, ast.ClassDef)}
        methods = lambda c: {m.name: m for m in c.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}  # noqa: E731
        taken: dict[str, ast.AST] = {}
        for c in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            own = methods(c)
            for b in c.bases:
                bname = imported.get(ast.unparse(b))
                if bname not in base_classes:
                    continue
                for name, m in methods(base_classes[bname]).items():
                    if name not in own:
                        taken[f"{bname}.{name}"] = m
                init = own.get("__init__")
                if init is not None and "super().__init__" in ast.unparse(init) and "__init__" in methods(
                        base_classes[bname]):
                    taken[f"{bname}.__init__"] = methods(base_classes[bname])["__init__"]
        todo = [q for q in taken if q.endswith(".__init__")]
        while todo:                                  # classes constructed by an __init__ in scope (one module)
            q = todo.pop()
            for name in _names_used(taken[q]) & set(base_classes):
                for mname, m in methods(base_classes[name]).items():
                    k = f"{name}.{mname}"
                    if k not in taken:
                        taken[k] = m
                        if mname == "__init__":
                            todo.append(k)
        out += [(base_rel, q, n) for q, n in taken.items()]
    loader = root / VLLM_ROPE_LOADER[0]
    if engine == "vllm" and loader.exists():
        n = find(loader, VLLM_ROPE_LOADER[1])
        if n is not None:
            out.append((VLLM_ROPE_LOADER[0], VLLM_ROPE_LOADER[1], n))
    return out


def _reads_any(node: ast.AST, keys: tuple[str, ...], field: str) -> bool:
    if field == "d2t":                                 # the checkpoint tensor's name, not a config key
        return any(isinstance(x, ast.Constant) and x.value == "d2t" for x in ast.walk(node))
    for x in ast.walk(node):
        if isinstance(x, ast.Constant) and x.value in keys:
            return True
        if (isinstance(x, ast.Attribute) and x.attr in keys and isinstance(x.ctx, ast.Load)
                and "config" in ast.unparse(x.value).lower()):
            return True
    return False


def derive_more_fields(engine: str, root: Path, version: str) -> list[dict]:
    """One fact per MORE_FIELDS field for the release's Llama drafter: honoured or ignored, the functions that read
    and apply it (file:function, with their hashes)."""
    if not (root / LLAMA_DRAFTER[engine]).exists():
        raise Drift(f"{engine} {version}: no {LLAMA_DRAFTER[engine]} in the wheel")
    scope = field_scope(engine, root)
    if engine == "vllm" and not any(f == VLLM_ROPE_LOADER[0] for f, _, _ in scope):
        raise Drift(f"vllm {version}: no {VLLM_ROPE_LOADER[0]}:{VLLM_ROPE_LOADER[1]} (the rope loader moved; read "
                    f"where rope_theta becomes rope_parameters now)")
    out = []
    for field, (keys, uses, builds) in MORE_FIELDS.items():
        reads = [f"{f}:{q}" for f, q, n in scope if _reads_any(n, keys, field)]
        applies = [f"{f}:{q}" for f, q, n in scope if set(uses) & _names_used(n)
                   and (field != "d2t" or q.rsplit(".", 1)[-1] != "load_weights")]
        honoured = bool(reads and applies)
        if honoured:                                   # cite the drafter file's own functions when it has some
            own = lambda xs: [x for x in xs if x.startswith(LLAMA_DRAFTER[engine] + ":")] or xs  # noqa: E731
            applies = own(applies)
            cited = sorted(set(reads + applies))
            short = lambda xs: ", ".join(dict.fromkeys(xs))  # noqa: E731
            how = (f"{short(reads)} reads {' / '.join(keys)}; {short(applies)} "
                   f"{'applies it' if field != 'd2t' else 'maps draft ids with it'}")
            gate = [r for r in reads if _reads_any(next(n for f, q, n in scope if f"{f}:{q}" == r), ("layer_types",),
                                                   "layer_types")]
            if field == "sliding_window" and gate:
                how += f" (only on the layers layer_types marks sliding_attention: {gate[0]} reads layer_types)"
        else:
            site = applies[:1] or [f"{LLAMA_DRAFTER[engine]}:{q}" for f, q, _ in scope
                                   if f == LLAMA_DRAFTER[engine] and q.endswith("__init__")][-1:]
            cited = site
            how = (f"no function reads {' / '.join(keys)}"
                   + (f"; {site[0]} builds {builds} without it" if site else ""))
        code = {}
        for c in cited:
            f, q = c.split(":", 1)
            node = next(n for ff, qq, n in scope if ff == f and qq == q)
            code[c] = digest(node)
        out.append(dict(engine=engine, version=version, file=LLAMA_DRAFTER[engine], architectures=[], field=field,
                        status="honoured" if honoured else "ignored", reads=reads if honoured else [],
                        applies=applies if honoured else [], code=code, decided_by=how))
    return out


# ------------------------------------------------------------------------------------------- table I/O + check

KEPT = ("status", "seen", "note")


def _key(r: dict) -> tuple:
    return r["producer"], str(r["versions"]), tuple(r["families"])


def table_parts(path: Path = TABLE) -> tuple[str, list[dict], str]:
    s = path.read_text()
    if BEGIN not in s or END not in s:
        raise SystemExit(f"{path}: the derived-rows markers are missing")
    head, rest = s.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    return head, yaml.safe_load(body) or [], tail


def compare(derived: list[dict], table: list[dict]) -> list[str]:
    """Differences between the rows derived from the wheels and the table's rows (KEPT fields ignored)."""
    t = {_key(r): r for r in table}
    out = []
    for r in derived:
        have = t.get(_key(r))
        if have is None:
            out.append(f"{r['producer']} {r['versions']} {r['families']}: no such row in the table")
            continue
        for k, v in r.items():
            if k in KEPT:
                continue
            if k == "wheels":
                for ver, w in v.items():
                    hw = (have.get("wheels") or {}).get(ver)
                    if hw is None:
                        out.append(f"{r['producer']} {ver}: the table's row {r['versions']} does not list this wheel")
                        continue
                    if hw.get("sha256") != w["sha256"]:
                        out.append(f"{r['producer']} {ver}: wheel sha256 {w['sha256'][:12]} != table "
                                   f"{str(hw.get('sha256'))[:12]}")
                    for fn, h in w["code"].items():
                        if (hw.get("code") or {}).get(fn) != h:
                            out.append(f"{r['producer']} {ver}: code at {fn} changed (hash {h} != table "
                                       f"{(hw.get('code') or {}).get(fn)}); read it and update the row")
                continue
            if have.get(k) != v:
                out.append(f"{r['producer']} {r['versions']} {r['families']}: {k} is {v} in the wheel, "
                           f"the table says {have.get(k)}")
    return out


def dump_rows(rows: list[dict]) -> str:
    out = []
    for r in rows:
        out.append(yaml.safe_dump([r], sort_keys=False, default_flow_style=None, width=118).rstrip())
    return "\n\n".join(out) + "\n"


SELECTION_WORDS = {
    "env_only": "V1 unless VLLM_USE_V2_MODEL_RUNNER=1 (no automatic choice)",
    "listed_dense_unquantized": "V2 for listed architectures that are neither MoE nor quantized",
    "listed": "V2 for listed architectures",
    "listed_or_dense": "V2 for listed architectures or any non-MoE target (hybrid stays V1)",
    "all": "V2 for every target",                 # (every automatic choice: unless an unsupported feature is on)
}
IDS_WORDS = {"top_level": "top level only", "top_then_nested": "top level, then eagle_config",
             "top_then_nested_layer_ids": "top level, then eagle_config.layer_ids (nested eagle_aux_... ignored)",
             "nested": "eagle_config only", "nested_then_top": "eagle_config, then top level"}
RULE_WORDS = {"input": "S_a", "after": "S_{a+1}", "after_if_first_1": "S_{a+1} if ids[0]==1 else S_a",
              "input_if_max_n": "S_a if max(ids)==N else S_{a+1}", "unsupported": "no EAGLE-3 capture"}


ENV0_WORDS = {"error": " (VLLM_USE_V2_MODEL_RUNNER=0: ValueError)",
              "overrides": " (even with VLLM_USE_V2_MODEL_RUNNER=0)"}
FORCED_WHAT = {"prefill context parallelism": "prefill_context_parallel_size > 1",
               "HiSparse": "attention_config.hisparse_config", "watermarking": "watermark_config"}


def _spans(versions: list[str], all_versions: list[str]) -> str:
    """['0.30.0', '0.31.0', ...] -> '0.30.0-0.33.0' (runs of consecutive releases in all_versions)."""
    out, run = [], []
    for v in all_versions:
        if v in versions:
            run.append(v)
        elif run:
            out.append(run)
            run = []
    if run:
        out.append(run)
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in out)


def forced_note(vllm_facts: list[dict]) -> str:
    """One sentence on the conditions that force V2 and what VLLM_USE_V2_MODEL_RUNNER=0 does to each."""
    allv = [f["version"] for f in vllm_facts]
    by: dict[tuple[str, str], list[str]] = {}
    for f in vllm_facts:
        rc = f["runner_choice"]
        for n in rc.get("forces_v2") or []:
            by.setdefault((n, (rc.get("forces_v2_env0") or {}).get(n, "env_wins")), []).append(f["version"])
    if not by:
        return ""
    words = {"env_wins": "checked after VLLM_USE_V2_MODEL_RUNNER, so =0 still gives V1",
             "error": "checked before VLLM_USE_V2_MODEL_RUNNER and the unsupported features; =0 makes vLLM raise "
                      "ValueError",
             "overrides": "checked before VLLM_USE_V2_MODEL_RUNNER and the unsupported features; V2 even with =0"}
    parts = [f"{n} (`{FORCED_WHAT.get(n, n)}`) in {_spans(vs, allv)}: {words[w]}" for (n, w), vs in by.items()]
    return ("Conditions that force V2 (`forces_v2` in the rows, `forces_v2_env0` what VLLM_USE_V2_MODEL_RUNNER=0 "
            "does; modelled by backend/vllm_runner.py `resolve`): " + "; ".join(parts) + ".")


H200_RUNS = [  # what the newest releases fed on the lent H200 (the rows' `seen`); the records hold every case
    "## Seen on the H200 (2026-12-01, one NVIDIA H200, torch 2.11.0+cu130; ids read from the running engine)", "",
    "| release | what ran | fed | command | record |", "|---|---|---|---|---|",
    "| SGLang 0.5.17 | toy Llama N=8: drafter nested [2, 4, 5]; drafter without ids | S_3, S_5, S_6; S_2, S_4, S_5 | "
    "`python gpu/sglang_suite.py --skip-capture --engine-option attention-backend=triton` | "
    "docs/results/sglang_0.5.17_h200.json |",
    "| SGLang 0.5.17 | DeepSeek-V3 N=61 nested [1, 29, 57] / [3, 30, 58]; Llama N=61 [3, 30, 58]; Llama N=32 no ids; "
    "GPT-OSS N=24 [1, 11, 24] (dummy weights) | S_2, S_30, S_58 / S_3, S_30, S_58; S_4, S_31, S_59; S_2, S_16, S_29; "
    "S_1, S_11, S_24 | `python gpu/sglang_suite.py --real-only --engine-option attention-backend=triton` | "
    "docs/results/sglang_0.5.17_h200.json |",
    "| vLLM 0.25.1 | toy Llama N=8: matched and after-layer drafters (V2); nested-only [1, 3, 6] on V2 and on V1 | "
    "S_2, S_4, S_5; S_2, S_4, S_5 (nested ignored) and S_1, S_3, S_6 | `python gpu/vllm_suite.py toy --only "
    "bench_vllm_matched,bench_vllm_after_layer,nested_v2,nested_v1` | docs/results/vllm_toy_0.25.1_h200.json |",
    "| vLLM 0.25.1 | 8 real-config cases (gpu/runner_check.py) | as 0.24.0 | `python gpu/runner_check.py` | "
    "docs/results/vllm_runner_check_0.25.1_h200.json |",
]


def markdown(facts: dict) -> str:
    """A per-release summary of the derived facts (docs/RELEASES.md)."""
    out = ["# What each engine release does with EAGLE-3 aux layer ids", "",
           "Generated by `python tools/rederive_conventions.py --markdown docs/RELEASES.md` from the released wheels "
           "(the same facts as the vLLM/SGLang rows of backend/conventions.yaml, which cite the file and function of "
           "each). Seen on an H200: vLLM 0.24.0 and 0.25.1 (gpu/runner_check.py, gpu/vllm_suite.py toy), SGLang 0.5.15 "
           "and 0.5.17 (gpu/sglang_suite.py; 0.5.17: Llama/Qwen, DeepSeek and GPT-OSS rows, 2026-12-01, "
           "docs/results/sglang_0.5.17_h200.json); every other "
           "release is read in code only. SGLang 0.5.0 is not on PyPI; its .postN releases fall in their release's row "
           "but their wheels were not read.", "", *H200_RUNS, "",
           "## vLLM (default ids (2, N//2, N-3); id a = S_a, the input of layer a, in every release)", "",
           "An automatic V2 choice falls back to V1 when `_get_v2_model_runner_unsupported_features()` finds one "
           "of the features that release lists (its row in backend/conventions.yaml names them).", "",
           *([forced_note(facts.get("vllm", [])), ""] if forced_note(facts.get("vllm", [])) else []),
           "| release | runner choice (VllmConfig.use_v2_model_runner) | V2 architectures listed | V1 reads ids from | "
           "V2 reads ids from |", "|---|---|---|---|---|"]
    for f in facts.get("vllm", []):
        rc = f["runner_choice"]
        env0 = rc.get("forces_v2_env0") or {}
        forced = "".join(f"{'; ' if i == 0 else ', '}{n} forces V2{ENV0_WORDS.get(env0.get(n), '')}"
                         for i, n in enumerate(rc.get("forces_v2") or []))
        out.append(f"| {f['version']} | {SELECTION_WORDS.get(rc['selection'], rc['selection'])}{forced} | "
                   f"{', '.join(rc.get('v2_architectures') or []) or '-'} | {IDS_WORDS[f['ids_from']['v1']]} | "
                   f"{IDS_WORDS[f['ids_from']['v2']]} |")
    out += ["", "## SGLang (ids read from eagle_config only; default [2, N//2, N-3] with no +1)", "",
            "| release | Llama / Qwen | DeepSeek-V2/V3, Kimi-K2 | GLM-4-MoE-Lite | GPT-OSS | "
            "--enable-return-aux-hidden-states | ids read in |", "|---|---|---|---|---|---|---|"]
    for f in facts.get("sglang", []):
        fam = f["families"]
        out.append(f"| {f['version']} | {RULE_WORDS[fam['llama']['rule']]} | "
                   f"{RULE_WORDS[fam['deepseek_v2']['rule']]} | "
                   f"{RULE_WORDS[fam['glm4_moe_lite']['rule']]} | {RULE_WORDS[fam['gpt_oss']['rule']]} | "
                   f"{'yes' if f['return_aux_hidden_states_flag'] else 'no'} | `{f['decided_by']['ids']}` |")
    return "\n".join(out) + "\n" + fields_markdown() + kinds_markdown()


def fields_markdown() -> str:
    """The section of docs/RELEASES.md on the drafter config fields, from backend/drafter_fields.yaml."""
    if not FIELDS_TABLE.exists():
        return ""
    rows = yaml.safe_load(FIELDS_TABLE.read_text()) or []
    out = ["", "## Drafter config fields each release honours or ignores", "",
           "From `backend/drafter_fields.yaml` (`python tools/rederive_conventions.py --fields --write`: every "
           "`*eagle3*.py` drafter model file of every release above, read, not run). The lint (`check-drafter "
           "--lint-only --engine E --engine-version V`) reports a field the drafter's config sets to true that "
           "release's Llama drafter file (`llama_eagle3.py`, which loads SpecLens's three formats) ignores; a release "
           "outside the table is not derived and gets no such finding. The other drafter files (DeepSeek/Kimi MLA, "
           "Qwen3) are in the table but not used by the lint.", "",
           "The other fields (draft_vocab_size, d2t, target_hidden_size, rope_theta, rope_scaling, sliding_window, "
           "tie_word_embeddings, head_dim) are read in the Llama drafter file together with the llama.py classes it "
           "builds on (the base methods it inherits or reaches through super().__init__, and the attention and MLP "
           "classes those construct) and, for vLLM, `vllm/transformers_utils/config.py:patch_rope_parameters`, which "
           "turns rope_theta / rope_scaling into the rope_parameters the attention reads. What they show: vLLM never "
           "reads tie_word_embeddings (the drafter's own lm_head scores the draft) and applies sliding_window only on "
           "the layers `layer_types` marks `sliding_attention`; SGLang never reads sliding_window from the config "
           "(0.5.23 takes a draft window from its server arguments instead); every release honours the draft vocab "
           "and d2t, target_hidden_size, rope and head_dim. The lint warns on each field a config sets that the chosen "
           "release ignores. Which keys a release reads the aux layer ids from is the `ids_from` of each row of "
           "backend/conventions.yaml (tables above), not repeated here. The cost of a dropped rope setting and of an "
           "ignored norm_before_fc on the toy pair is in docs/PERFORMANCE.md (tools/field_cost.py).", "",
           "| Engine | Releases | Field | Llama drafter | Decided by |", "|---|---|---|---|---|"]
    for r in rows:
        if r["file"] != LLAMA_DRAFTER[r["engine"]]:
            continue
        eng = engine_label(r["engine"])
        span = r["releases"][0] + (f"-{r['releases'][-1]}" if len(r["releases"]) > 1 else "")
        out.append(f"| {eng} | {span} | `{r['field']}` | {r['status']} | {r['decided_by']} |")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- drafter kinds

# Issue 23: the drafter kinds other than Llama EAGLE-3 that read target hidden states (--kinds). Per release of each
# engine: whether the kind is served (its drafter architectures registered), where its ids are read (config key,
# nesting, any +1, in precedence order), what an id then means and the default when none is written. Rows go to the
# KINDS block of backend/conventions.yaml (`kind:` rows; backend/drafter/kinds.py reads them, backend/coords.py
# skips them, so every EAGLE-3 reader keeps its rows).
KINDS_BEGIN = "# ---- BEGIN kind rows derived from the wheels (tools/rederive_conventions.py --kinds --write)"
KINDS_END = "# ---- END kind rows"
# kind -> the drafter architectures (vLLM _SPECULATIVE_DECODING_MODELS keys, SGLang EntryClass names) that make a
# config that kind. eagle3_1 (EAGLE-3 with fc_norm / norm_output) loads through the EAGLE-3 architectures.
KIND_ARCHS = {
    "dflash": ["DFlashDraftModel"],
    "dflash2": ["DFlash2DraftModel"],
    "p_eagle": ["PEagleDraftModel", "PeagleLlamaForCausalLM", "PeagleQwen3ForCausalLM"],
    "eagle3_mla": ["Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"],
    "eagle3_1": ["LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"],
    "mtp": ["DeepSeekMTPModel", "DeepseekV3ForCausalLMNextN"],
}
KINDS = tuple(KIND_ARCHS)
VLLM_REGISTRY = "vllm/model_executor/models/registry.py"
SGLANG_DFLASH_UTILS = "sglang/srt/speculative/dflash_utils.py"


def _registry_dict(path: Path, name: str) -> tuple[dict[str, list[str]], ast.AST | None]:
    """A vLLM registry dict literal ({arch: (module, class)}) and its node."""
    t = _tree(path)
    for n in t[0].body if t else []:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        if any(getattr(x, "id", None) == name for x in targets) and isinstance(n.value, ast.Dict):
            out = {}
            for k, v in zip(n.value.keys, n.value.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple):
                    out[k.value] = [e.value for e in v.elts if isinstance(e, ast.Constant)]
            return out, n
    return {}, None


def _key_of(call: ast.AST, containers: dict[str, str]) -> tuple[str, str] | None:
    """(container, key) a read expression takes: getattr(hf_config, 'K', ...) -> ('top', K); X.get('K') -> (C, K)
    where X = getattr(hf_config, 'C', ...); hf_config.K -> ('top', K); `A or []` -> A's."""
    if isinstance(call, ast.BoolOp):
        return _key_of(call.values[0], containers)
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "getattr" \
            and ast.unparse(call.args[0]) == "hf_config" and isinstance(call.args[1], ast.Constant):
        return "top", call.args[1].value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "get" \
            and isinstance(call.args[0], ast.Constant):
        owner = ast.unparse(call.func.value)
        if owner in containers:
            return containers[owner], call.args[0].value
    if isinstance(call, ast.Attribute) and ast.unparse(call.value) == "hf_config":
        return "top", call.attr
    if isinstance(call, ast.Name) and call.id in containers:
        return containers[call.id], ""
    return None


def vllm_id_reads(node: ast.AST | None, who: str) -> list[list[dict]]:
    """The ids a vLLM `*_aux_layers_from_config` function reads, as blocks in precedence order: a block runs only
    when no ids were found before it, its reads in code order, a later one replacing an earlier one. Each read:
    {in: top | dflash_config | eagle_config, key, add (+1 or 0 applied to each id), assign: always (the value, even
    none) | container (when `in` is a dict: its value, even none) | value (only a non-empty value)}."""
    if node is None:
        raise Drift(f"{who}: not found; the table cites it")
    fn = ast.parse(text(node)).body[0]
    containers: dict[str, str] = {}
    aliases: dict[str, tuple[str, str]] = {}
    blocks: list[list[dict]] = []

    def value_read(v: ast.AST, assign: str, when: str = "") -> dict:
        add = 0
        if isinstance(v, ast.ListComp):
            elt, gen = v.elt, v.generators[0]
            if ast.unparse(elt) != f"{ast.unparse(gen.target)} + 1":
                raise Drift(f"{who}: `{ast.unparse(v)}` maps ids in a way this script cannot parse; read it")
            add, v = 1, gen.iter
        elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "list":
            v = v.args[0]
        if isinstance(v, ast.Name) and v.id in aliases:
            where, key = aliases[v.id]
        else:
            got = _key_of(v, containers)
            if got is None:
                raise Drift(f"{who}: `layer_ids = {ast.unparse(v)}` reads ids in a way this script cannot parse")
            where, key = got
        r = {"in": where, "key": key, "add": add, "assign": assign}
        if when:
            r["when"] = when
        return r

    def walk(body: list[ast.stmt], block: list[dict], assign: str, when: str = "") -> None:
        for st in body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                name, v = st.targets[0].id, st.value
                if name == "hf_config":
                    continue
                if name == "layer_ids":
                    block.append(value_read(v, assign, when))
                    continue
                got = _key_of(v, containers)
                if got and got[0] == "top" and got[1] in ("dflash_config", "eagle_config"):
                    containers[name] = got[1]
                elif got:
                    aliases[name] = got
                continue
            if isinstance(st, ast.If):
                test = ast.unparse(st.test)
                if test == "not layer_ids":
                    nb: list[dict] = []
                    blocks.append(nb)
                    walk(st.body, nb, "always")
                elif re.fullmatch(r"(\w+) and isinstance\(\1, dict\)", test):
                    walk(st.body, block, "container")
                elif re.fullmatch(r"\w+", test) and test in aliases:
                    walk(st.body, block, "value")
                elif test == "layer_ids and isinstance(layer_ids, (list, tuple))":
                    continue
                elif "spec_config" in test or "speculative_config" in test or test.startswith("not hasattr(hf_config"):
                    continue
                else:                              # a condition on the config (dspark's model_type): both branches
                    walk(st.body, block, assign, when=test)
                    walk(st.orelse, block, assign, when=f"not ({test})")
                continue
            if isinstance(st, ast.For) and isinstance(st.iter, ast.Tuple):
                names = [e.value for e in st.iter.elts if isinstance(e, ast.Constant)]
                inner = ast.unparse(st)
                m = re.search(r"layer_ids = \w+\.get\('(\w+)'\)", inner)
                if not m or not names:
                    raise Drift(f"{who}: a loop over {names} this script cannot parse; read it")
                block.extend({"in": c, "key": m.group(1), "add": 0, "assign": "value"} for c in names)
                continue
            if isinstance(st, (ast.Return, ast.Expr)):
                continue
            raise Drift(f"{who}: statement `{ast.unparse(st)[:80]}` is not understood here; read it")

    top: list[dict] = []
    blocks.append(top)
    walk(fn.body, top, "always")
    return [b for b in blocks if b]


_SGLANG_INDEX: dict[Path, tuple[dict, dict]] = {}


def _sglang_index(root: Path) -> tuple[dict, dict]:
    """(files, class index) of a SGLang release's models, built once per release."""
    if root not in _SGLANG_INDEX:
        models = root / "sglang/srt/models"
        files = {"sglang.srt.models." + ".".join(p.relative_to(models).with_suffix("").parts): p
                 for p in sorted(models.rglob("*.py"))}
        _SGLANG_INDEX.clear()
        _SGLANG_INDEX[root] = (files, class_index(files))
    return _SGLANG_INDEX[root]


def _sglang_registered(root: Path) -> set[str]:
    files, index = _sglang_index(root)
    return {key.rsplit(".", 1)[-1] for mod, path in files.items() for key in entry_classes(index, path, mod)}


def _family_arch_rule(root: Path, method: str, rule_of) -> dict[str, dict]:
    """SGLang: every registered architecture whose class runs `method` -> {file, class, rule}."""
    models = root / "sglang/srt/models"
    files, index = _sglang_index(root)
    out = {}
    for mod, path in files.items():
        for key in entry_classes(index, path, mod):
            d = defining_class(index, key, method)
            if d is None:
                continue
            node = index[d]["methods"][method]
            rel = f"sglang/srt/models/{files[index[d]['module']].relative_to(models)}"
            out.setdefault(key.rsplit(".", 1)[-1], {"file": rel, "class": index[d]["name"], "rule": rule_of(node),
                                                    "hash": digest(node)})
    return dict(sorted(out.items()))


def _served(archs: list[str], registered: set[str]) -> list[str]:
    return [a for a in archs if a in registered]


def _norm_last(node: ast.AST | None) -> bool:
    """The target model's forward returns its final norm's output (self.norm applied, directly or through a helper)."""
    return node is not None and re.search(r"self\.norm\b", text(node)) is not None


def derive_kinds_vllm(root: Path, version: str) -> dict:
    f = {k: root / v for k, v in VLLM_FILES.items()}
    reg, reg_node = _registry_dict(root / VLLM_REGISTRY, "_SPECULATIVE_DECODING_MODELS")
    if not reg:
        raise Drift(f"vLLM {version}: {VLLM_REGISTRY} has no _SPECULATIVE_DECODING_MODELS dict; read it")
    v1 = find(f["v1"], "GPUModelRunner._get_eagle3_aux_layers_from_config")
    v2 = find(f["v2"], "get_eagle3_aux_layers_from_config")
    reads = {"v1": vllm_id_reads(v1, f"vLLM {version} V1 _get_eagle3_aux_layers_from_config"),
             "v2": vllm_id_reads(v2, f"vLLM {version} V2 get_eagle3_aux_layers_from_config")}
    ds_model = find(f["deepseek"], "DeepseekV2Model.forward")
    code = {f"{VLLM_REGISTRY}:_SPECULATIVE_DECODING_MODELS": digest(reg_node),
            f"{VLLM_FILES['v1']}:GPUModelRunner._get_eagle3_aux_layers_from_config": digest(v1),
            f"{VLLM_FILES['v2']}:get_eagle3_aux_layers_from_config": digest(v2),
            f"{VLLM_FILES['deepseek']}:DeepseekV2Model.forward": digest(ds_model)}
    kinds = {}
    for kind, archs in KIND_ARCHS.items():
        served = _served(archs, set(reg))
        kinds[kind] = {"served": bool(served), "architectures": served,
                       "files": sorted({reg[a][0] for a in served})}
    if not _norm_last(ds_model):
        raise Drift(f"vLLM {version}: {VLLM_FILES['deepseek']} DeepseekV2Model.forward no longer ends in self.norm; "
                    f"read what the MTP head is fed")
    return {"engine": "vllm", "version": version, "wheel_sha256": (root / "WHEEL_SHA256").read_text().strip(),
            "reads": reads, "kinds": kinds, "mtp_fed": "F", "code": code}


def sglang_dflash_reading(root: Path, version: str) -> tuple[list[list[dict]], dict, dict]:
    """SGLang's DFlash id reading (parse_dflash_draft_config) and default (build_target_layer_ids)."""
    p = root / SGLANG_DFLASH_UTILS
    parse = find(p, "parse_dflash_draft_config")
    build = find(p, "build_target_layer_ids")
    s = text(parse)
    if not re.search(r"dflash_cfg\.get\('target_layer_ids', _cfg_get\(draft_hf_config, 'target_layer_ids', None\)\)",
                     s):
        raise Drift(f"SGLang {version}: {SGLANG_DFLASH_UTILS} parse_dflash_draft_config reads target_layer_ids in a "
                    f"way this script cannot parse; read it")
    b = text(build)
    if not (re.search(r"return \[num_target_layers // 2\]", b) and "start = 1" in b
            and "end = num_target_layers - 3" in b
            and "round(start + i * span / (num_draft_layers - 1))" in b):
        raise Drift(f"SGLang {version}: {SGLANG_DFLASH_UTILS} build_target_layer_ids changed; read it")
    reads = [[{"in": "dflash_config", "key": "target_layer_ids", "add": 0, "assign": "present"}],
             [{"in": "top", "key": "target_layer_ids", "add": 0, "assign": "always"}]]
    default = {"spread": [1, "N-3"], "count": "draft num_hidden_layers", "one_layer": "N//2"}
    code = {f"{SGLANG_DFLASH_UTILS}:parse_dflash_draft_config": digest(parse),
            f"{SGLANG_DFLASH_UTILS}:build_target_layer_ids": digest(build)}
    return reads, default, code


def _dflash_rule(node: ast.AST) -> str:
    """after: the target captures S_{t+1} for id t (`[val + 1 for val in ids]`); input: S_t (the ids go unchanged to
    a model that captures the input of each listed layer); delegates: to a wrapped language model."""
    s = text(node)
    param = node.args.args[1].arg if len(node.args.args) > 1 else "layer_ids"
    after = rf"(layers_to_capture = |\.set_dflash_layers_to_capture\()[\[{{]\s*(\w+) \+ 1 for \2 in {param}\s*[\]}}]"
    if re.search(after, s):
        return "after"
    if re.search(rf"self\.model\.set_dflash_layers_to_capture\({param}\)", s) or \
            re.search(rf"layers_to_capture = (list\()?{param}\)?\s*$", s, re.M):
        return "input"
    if re.search(rf"\.set_dflash_layers_to_capture\({param}\)", s):
        return "delegates"
    if re.search(rf"self\.set_dspark_layers_to_capture\({param}\)", s):
        return "dspark_taps"     # Kimi-K3: its DSpark taps capture each layer's output, so S_{t+1} (not read further)
    return "unparsed"


def derive_kinds_sglang(root: Path, version: str) -> dict:
    registered = _sglang_registered(root)
    kinds = {}
    for kind, archs in KIND_ARCHS.items():
        served = _served(archs, registered)
        kinds[kind] = {"served": bool(served), "architectures": served}
    code: dict[str, str | None] = {}
    out = {"engine": "sglang", "version": version, "wheel_sha256": (root / "WHEEL_SHA256").read_text().strip(),
           "kinds": kinds, "code": code}
    if kinds["dflash"]["served"] or kinds["dflash2"]["served"]:
        reads, default, c = sglang_dflash_reading(root, version)
        code.update(c)
        capture = _family_arch_rule(root, "set_dflash_layers_to_capture", _dflash_rule)
        bad = {a: d for a, d in capture.items() if d["rule"] == "unparsed"}
        if bad:
            raise Drift(f"SGLang {version}: set_dflash_layers_to_capture of {sorted(bad)} maps ids in a way this "
                        f"script cannot parse; read it")
        by_rule: dict[str, list[str]] = {}
        for a, d in capture.items():
            by_rule.setdefault(d["rule"], []).append(a)
            code[f"{d['file']}:{d['class']}.set_dflash_layers_to_capture"] = d["hash"]
        out["dflash"] = {"reads": reads, "default": default, "capture": by_rule}
    ds_model = find(root / "sglang/srt/models/deepseek_v2.py", "DeepseekV2Model.forward")
    if kinds["mtp"]["served"]:
        if not _norm_last(ds_model):
            raise Drift(f"SGLang {version}: deepseek_v2.py DeepseekV2Model.forward no longer applies self.norm; read "
                        f"what the NextN head is fed")
        code["sglang/srt/models/deepseek_v2.py:DeepseekV2Model.forward"] = digest(ds_model)
        out["mtp_fed"] = "F"
    return out


KIND_DECIDED = {
    "vllm": {"served": f"{VLLM_REGISTRY}: _SPECULATIVE_DECODING_MODELS",
             "ids_v1": f"{VLLM_FILES['v1']}: GPUModelRunner._get_eagle3_aux_layers_from_config",
             "ids_v2": f"{VLLM_FILES['v2']}: get_eagle3_aux_layers_from_config",
             "meaning": "the EAGLE-3 rows' rule (vllm/model_executor/models/llama.py: LlamaModel.forward: id a = the "
                        "input of layer a); no ids: the target's EAGLE-3 default",
             "mtp_fed": f"{VLLM_FILES['deepseek']}: DeepseekV2Model.forward (returns self.norm's output)"},
    "sglang": {"served": "sglang/srt/models/*.py: EntryClass",
               "ids": f"{SGLANG_DFLASH_UTILS}: parse_dflash_draft_config",
               "default": f"{SGLANG_DFLASH_UTILS}: build_target_layer_ids",
               "meaning": "sglang/srt/models/*.py: <target class>.set_dflash_layers_to_capture",
               "eagle_ids": "the EAGLE-3 rows (eagle_config ids, each family's set_eagle3_layers_to_capture)",
               "mtp_fed": "sglang/srt/models/deepseek_v2.py: DeepseekV2Model.forward (returns self.norm's output)"},
}


def kind_rows(facts: dict[str, list[dict]]) -> list[dict]:
    """One row per (engine, kind, run of consecutive releases whose facts agree)."""
    rows: list[dict] = []
    order = RELEASES
    for eng in RELEASES:
        for kind in KINDS:
            cur = None
            for f in sorted(facts.get(eng, []), key=lambda f: order[eng].index(f["version"])):
                k = f["kinds"][kind]
                row = {"producer": eng, "kind": kind, "served": k["served"], "architectures": k["architectures"]}
                if k["served"]:
                    if kind == "mtp":
                        row.update(ids_from="none", feeds=[f["mtp_fed"]])
                    elif eng == "vllm":
                        row.update(ids_from=f["reads"], rule="engine_eagle3")
                    elif kind in ("dflash", "dflash2"):
                        d = f["dflash"]
                        row.update(ids_from={"any": d["reads"]}, rule="per_architecture", capture=d["capture"],
                                   default=d["default"])
                    else:
                        row.update(ids_from="eagle3", rule="engine_eagle3")
                code = f["code"]
                sig = json.dumps(row, sort_keys=True)
                i = order[eng].index(f["version"])
                if cur is not None and cur["_sig"] == sig and order[eng].index(cur["releases"][-1]) == i - 1:
                    cur["releases"].append(f["version"])
                    cur["wheels"][f["version"]] = {"sha256": f["wheel_sha256"], "code": code}
                    continue
                cur = {**row, "_sig": sig, "releases": [f["version"]],
                       "wheels": {f["version"]: {"sha256": f["wheel_sha256"], "code": code}}}
                rows.append(cur)
    for r in rows:
        rel = order[r["producer"]]
        last = rel.index(r["releases"][-1])
        hi = rel[last + 1] if last + 1 < len(rel) else _next_patch(r["releases"][-1])
        r["versions"] = f">={r['releases'][0]},<{hi}"
        del r["_sig"]
        r["decided_by"] = dict(KIND_DECIDED[r["producer"]])
        r["status"] = "inferred"
    keys = ("producer", "kind", "versions", "served", "architectures", "ids_from", "rule", "capture", "default",
            "feeds", "decided_by", "releases", "wheels", "status")
    return [{k: r[k] for k in keys if k in r} for r in rows]


def kinds_table_parts(path: Path = TABLE) -> tuple[str, list[dict], str]:
    s = path.read_text()
    if KINDS_BEGIN not in s:
        return s.rstrip("\n") + "\n\n", [], ""
    head, rest = s.split(KINDS_BEGIN, 1)
    body, tail = rest.split(KINDS_END, 1)
    return head, yaml.safe_load(body) or [], tail


def compare_kinds(derived: list[dict], table: list[dict]) -> list[str]:
    out = []
    t = {(r["producer"], r["kind"], r["versions"]): r for r in table}
    for r in derived:
        have = t.get((r["producer"], r["kind"], r["versions"]))
        name = f"{r['producer']} {r['kind']} {r['versions']}"
        if have is None:
            out.append(f"{name}: no such kind row in the table (run --kinds --write)")
            continue
        for k, v in r.items():
            if k in KEPT or k == "status":
                continue
            if have.get(k) != v:
                out.append(f"{name}: {k} differs: wheel {json.dumps(v)[:200]}, table {json.dumps(have.get(k))[:200]}")
    extra = {(r["producer"], r["kind"], r["versions"]) for r in table} - \
        {(r["producer"], r["kind"], r["versions"]) for r in derived}
    derived_engines = {r["producer"] for r in derived}
    out += [f"{' '.join(k)}: in the table, not derived" for k in sorted(extra) if k[0] in derived_engines]
    return out


KIND_WORDS = {"dflash": "DFlash", "dflash2": "DFlash2", "p_eagle": "P-EAGLE", "eagle3_mla": "EAGLE-3 MLA",
              "eagle3_1": "EAGLE-3.1", "mtp": "MTP / NextN (DeepSeek)"}


def _reads_words(blocks: list[list[dict]]) -> str:
    """The ordered reads of a kind row in words: 'eagle_aux_hidden_state_layer_ids, then dflash_config.target_layer_ids
    +1'."""
    parts = []
    for block in blocks:
        names = []
        for r in block:
            if r.get("when"):
                continue
            name = r["key"] if r["in"] == "top" else f"{r['in']}.{r['key']}"
            names.append(name + (" +1" if r["add"] else ""))
        if len(names) > 1 and block[0]["assign"] == "container":
            names = [" (replaced by ".join(names) + ")" * (len(names) - 1)]
        parts.extend(names)
    return ", then ".join(parts) if parts else "-"


def kinds_markdown(path: Path = TABLE) -> str:
    """docs/RELEASES.md's drafter-kinds section, from the kind rows of the table."""
    _, rows, _ = kinds_table_parts(path)
    if not rows:
        return ""
    out = ["", "## Drafter kinds beyond Llama EAGLE-3 (issue 23)", "",
           "From the kind rows of `backend/conventions.yaml` (`python tools/rederive_conventions.py --kinds --write`: "
           "the vLLM speculative-decoding registry and both runners' id readers, SGLang's EntryClass, DFlash id "
           "parser, default and each target's `set_dflash_layers_to_capture`, read in every wheel above; not run). "
           "`backend/drafter/kinds.py` reads them for the lint, `feeds` and the Drafter check page. "
           "DFlash trainers (z-lab, SpecForge) train on HF `hidden_states[t + 1]` for `target_layer_ids` t, i.e. "
           "S_{t+1}; speculators' DFlash `aux_hidden_state_layer_ids` a are S_a. EAGLE-3.1 (`fc_norm` + "
           "`norm_output`), P-EAGLE and MLA EAGLE-3 drafters are read as EAGLE-3 ids once a release serves them; an "
           "MTP/NextN head reads no ids and is fed the target's returned hidden state, F. Not modelled: SGLang "
           "0.5.19+ adds 1 for Muse Glimmer targets with Muse's own draft architectures "
           "(`spec_aux_hidden_state.py: _map_muse_target_layer_ids`), so the Muse S_t entries hold only for other "
           "DFlash drafters; vLLM's `dspark_target_layer_ids` reads (DSpark) are listed but DSpark is not a kind here.",
           "",
           "| engine | releases | kind | served | where the ids are read (first found wins; +1: the engine adds one) "
           "| an id means | default (no ids) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        eng = engine_label(r["producer"])
        span = r["releases"][0] + (f"-{r['releases'][-1]}" if len(r["releases"]) > 1 else "")
        if not r["served"]:
            out.append(f"| {eng} | {span} | {KIND_WORDS[r['kind']]} | not served | - | - | - |")
            continue
        ids = r.get("ids_from")
        if r["kind"] == "mtp":
            where, means, dflt = "none", "-", f"fed {', '.join(r['feeds'])}"
        elif ids == "eagle3":
            where, means, dflt = "as EAGLE-3 (eagle_config)", "as EAGLE-3", "as EAGLE-3"
        elif r["producer"] == "vllm":
            where = "V1: " + _reads_words(ids["v1"]) + "; V2: " + _reads_words(ids["v2"])
            means, dflt = "S_a for the id a after the +1 (the input of layer a)", "the target's EAGLE-3 default"
        else:
            where = _reads_words(ids["any"])
            cap = r.get("capture") or {}
            means = (f"S_(t+1) ({len(cap.get('after', [])) + len(cap.get('delegates', []))} target architectures)"
                     + (f"; S_t for {', '.join(cap['input'])}" if cap.get("input") else ""))
            dflt = "draft num_hidden_layers ids spread over [1, N-3] (one layer: N//2)"
        out.append(f"| {eng} | {span} | {KIND_WORDS[r['kind']]} | {', '.join(r['architectures'])} | {where} | "
                   f"{means} | {dflt} |")
    tail = kinds_table_parts(path)[2]
    trainers = [r for r in (yaml.safe_load(tail) or []) if isinstance(r, dict) and r.get("kind")]
    if trainers:
        out += ["", "DFlash trainers (the rows after the kind rows; read by hand in each wheel, not run):", "",
                "| trainer | releases | writes | the drafter was trained on | default | decided by |",
                "|---|---|---|---|---|---|"]
        for r in trainers:
            out.append(f"| {r['producer']} | {r['versions']} | {r['writes']} | {r['trained_on']} | "
                       f"{', '.join(r['default']) if isinstance(r['default'], list) else r['default']} | "
                       f"{'; '.join(r['decided_by'].values())} |")
    return "\n".join(out) + "\n"


def kinds_main(a, engines: list[str], cache: Path) -> int:
    facts: dict[str, list[dict]] = {e: [] for e in RELEASES}
    if a.facts:
        stored = json.loads(Path(a.facts).read_text())
        facts = {e: (stored.get(e, []) if e in engines else []) for e in RELEASES}
    else:
        for eng in engines:
            rels = VLLM_RELEASES if eng == "vllm" else SGLANG_RELEASES
            for v in [r for r in rels if not a.releases or r in a.releases]:
                root = kind_sources(eng, v, cache)
                facts[eng].append(derive_kinds_vllm(root, v) if eng == "vllm" else derive_kinds_sglang(root, v))
                print(f"{eng} {v}: kinds read", file=sys.stderr)
    rows = kind_rows(facts)
    if a.json:
        Path(a.json).write_text(json.dumps(facts, indent=1) + "\n")
    head, table, tail = kinds_table_parts()
    if a.write:
        keep = [r for r in table if r["producer"] not in engines]
        old = {(r["producer"], r["kind"], r["versions"]): r for r in table}
        for r in rows:
            o = old.get((r["producer"], r["kind"], r["versions"]), {})
            for k in KEPT:
                if k in o:
                    r[k] = o[k]
        allrows = sorted(rows + keep, key=lambda r: ({"vllm": 0, "sglang": 1}[r["producer"]], KINDS.index(r["kind"]),
                                                     _vkey(r["versions"])))
        TABLE.write_text(head + KINDS_BEGIN + "\n" + dump_rows(allrows) + KINDS_END + (tail or "\n"))
        print(f"wrote {len(rows)} kind rows to {TABLE.relative_to(REPO)}")
        return 0
    return _verdict(compare_kinds(rows, table), facts, engines, f"the kind rows of {TABLE.relative_to(REPO)}",
                    len(rows))


def _verdict(diffs: list[str], facts: dict, engines: list[str], what: str, n_rows: int) -> int:
    """Print the check's outcome against `what` (FAIL with each difference, or OK with the releases read): exit 1/0."""
    if diffs:
        print(f"FAIL: {len(diffs)} difference(s) between the wheels and {what}:")
        for d in diffs:
            print("  " + d)
        return 1
    n = {e: len(facts[e]) for e in engines}
    print(f"OK: {', '.join(f'{k} {v} release(s)' for k, v in n.items())} agree with {what} ({n_rows} rows)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=[*RELEASES, "all"], default="all")
    p.add_argument("--releases", nargs="*", help="only these releases (default: every release the script knows)")
    p.add_argument("--cache", help="where the extracted wheel files live (default ~/.cache/speclens/wheels)")
    p.add_argument("--write", action="store_true", help="rewrite the derived rows of the table")
    p.add_argument("--json", help="also write the derived facts to this file")
    p.add_argument("--markdown", help="also write a per-release summary (docs/RELEASES.md) to this file")
    p.add_argument("--facts", help="read the derived facts from this file (a --json output, e.g. "
                   "docs/results/conventions_derived.json) instead of the wheels: offline, for --markdown and the "
                   "check")
    p.add_argument("--kinds", action="store_true", help="the drafter kinds (DFlash, DFlash2, P-EAGLE, EAGLE-3 MLA, "
                   "EAGLE-3.1, MTP): per release, served or not, where their ids are read and what they mean (the "
                   "kind rows of backend/conventions.yaml): check, or --write them")
    p.add_argument("--fields", action="store_true", help="the drafter config fields each release honours or "
                   "ignores (backend/drafter_fields.yaml) instead of the id conventions: check, or --write it")
    a = p.parse_args(argv)
    cache = cache_dir(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    engines = list(RELEASES) if a.engine == "all" else [a.engine]
    if a.kinds:
        try:
            return kinds_main(a, engines, cache)
        except Drift as e:
            print(f"FAIL: {e}")
            return 1
    if a.fields:
        try:
            return fields_main(a, engines, cache)
        except Drift as e:
            print(f"FAIL: {e}")
            return 1
    facts: dict[str, list[dict]] = {e: [] for e in RELEASES}
    if a.facts:
        stored = json.loads(Path(a.facts).read_text())
        facts = {e: (stored.get(e, []) if e in engines else []) for e in RELEASES}
    try:
        for eng in ([] if a.facts else engines):
            rels = VLLM_RELEASES if eng == "vllm" else SGLANG_RELEASES
            if a.releases:
                rels = [r for r in rels if r in a.releases] + [r for r in a.releases if r not in rels and
                                                                (r.startswith("0.5.") == (eng == "sglang"))]
            for v in rels:
                root = sources(eng, v, cache)
                facts[eng].append(derive_vllm(root, v) if eng == "vllm" else derive_sglang(root, v))
                print(f"{eng} {v}: read", file=sys.stderr)
        rows = vllm_rows(facts["vllm"]) + sglang_rows(facts["sglang"])
    except Drift as e:
        print(f"FAIL: {e}")
        return 1
    if a.json:
        Path(a.json).write_text(json.dumps(facts, indent=1) + "\n")
    if a.markdown:
        Path(a.markdown).write_text(markdown(facts))
    head, table, tail = table_parts()
    if a.write:
        old = {_key(r): r for r in table}
        keep = [r for r in table if r["producer"] not in engines or
                (a.releases and not any(_key(r) == _key(n) for n in rows))]
        new = []
        for r in rows:
            o = old.get(_key(r), {})
            for k in KEPT:
                if k in o:
                    r[k] = o[k]
            new.append(r)
        order = {"vllm": 0, "sglang": 1}
        allrows = sorted(new + [r for r in keep if _key(r) not in {_key(n) for n in new}],
                         key=lambda r: (order.get(r["producer"], 2), _vkey(r["versions"]),
                                        0 if r["families"] != ["*"] else 1))
        TABLE.write_text(head + BEGIN + "\n" + dump_rows(allrows) + END + tail)
        print(f"wrote {len(rows)} derived rows to {TABLE.relative_to(REPO)}")
        return 0
    return _verdict(compare(rows, table), facts, engines, str(TABLE.relative_to(REPO)), len(rows))


def _vkey(spec: str) -> tuple:
    m = re.match(r">=([0-9.]+)", spec)
    return tuple(int(x) for x in m.group(1).split(".")) if m else (0,)


if __name__ == "__main__":
    sys.exit(main())
