"""Regenerate tests/data/peers/speculators-dflash/: the toy DFlash drafter as speculators' own converter writes it.

speculators 0.9.0 ships `speculators.convert.dflash.DFlashConverter`, which turns a z-lab / SpecForge DFlash checkpoint
(`dflash_config.target_layer_ids`) into a speculators checkpoint (`speculators_model_type: dflash`,
`aux_hidden_state_layer_ids`). This runs that converter, unchanged, on tests/data/dflash_toy (the DFlash drafter
trained on the shipped toy target, ids [0, 3, 6]) with the toy target as the verifier, and keeps what it wrote:
its config.json and model.safetensors as written (2 MB: the converter leaves the verifier's embedding and LM head out
of the file, they are filled from the verifier at load). FIXTURE.json records the versions, the command, the ids in
and out, each file's size and SHA-256, and the truth the tests check.

speculators needs a few packages the project does not (loguru, datasets, openai, pydantic-settings, hs-connectors):
install them beside the project's venv, not into it, and put that folder first on PYTHONPATH:

    .venv/bin/pip install --target /tmp/spec-site --no-deps speculators==0.9.0 hs-connectors==0.9.0 loguru==0.7.3 \\
        pydantic-settings python-dotenv openai datasets dill multiprocess xxhash jiter httpx2 httpcore2 sniffio \\
        truststore
    PYTHONPATH=/tmp/spec-site .venv/bin/python tools/peer_fixtures/speculators_dflash.py
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SOURCE = REPO / "tests" / "data" / "dflash_toy"
OUT = REPO / "tests" / "data" / "peers" / "speculators-dflash"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default=None, help="scratch folder (the toy target, the converted checkpoint)")
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from speculators.convert.dflash import DFlashConverter

    from backend.store.data_root import DataRoot
    from backend.toy.shipped import toy_pair

    work = Path(a.work or tempfile.mkdtemp(prefix="spec-dflash-"))
    target = toy_pair(DataRoot(work / "data")) / "target"
    converted = work / "converted"
    shutil.rmtree(converted, ignore_errors=True)
    DFlashConverter().convert(input_path=str(SOURCE), output_path=str(converted), base_model=str(target),
                              validate=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(converted / name, out / name)
    written = json.loads((converted / "config.json").read_text())
    source = json.loads((SOURCE / "config.json").read_text())
    training = json.loads((SOURCE / "TRAINING.json").read_text())
    n = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    ids_in = source["dflash_config"]["target_layer_ids"]
    fixture = {
        "written_by": {"tool": "speculators", "version": md.version("speculators"),
                       "code": "speculators.convert.dflash.DFlashConverter().convert(input_path, output_path, "
                               "base_model, validate=True)",
                       "torch": md.version("torch"), "transformers": md.version("transformers")},
        "command": "PYTHONPATH=/tmp/spec-site .venv/bin/python tools/peer_fixtures/speculators_dflash.py",
        "input": {"path": "tests/data/dflash_toy", "dflash_config.target_layer_ids": ids_in},
        "verifier": {"what": "the shipped toy target (backend/toy/shipped.py toy_pair)", "num_hidden_layers": n},
        "output": {"aux_hidden_state_layer_ids": written.get("aux_hidden_state_layer_ids"),
                   "files": {f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)}
                             for f in sorted(converted.iterdir()) if f.is_file()}},
        "truth": {
            "source_reads_as": [f"S_{t + 1}" for t in ids_in],
            "converted_reads_as": [f"S_{a}" for a in written.get("aux_hidden_state_layer_ids") or []],
            "trained_on": training["trained_on"],
            "why": "z-lab/SpecForge id t = hidden_states[t + 1] = S_(t+1); speculators id a = the input of layer a = "
                   "S_a; the converter writes t + 1 for each t (dropping t + 1 == N), so both name the same states. "
                   "The toy drafter itself was trained on S_t (tools/dflash_toy.py, convention 'before'): served as "
                   "converted, it is fed one layer late.",
        },
    }
    (out / "FIXTURE.json").write_text(json.dumps(fixture, indent=2) + "\n")
    print(json.dumps(fixture["output"], indent=2))


if __name__ == "__main__":
    main()
