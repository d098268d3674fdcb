"""Jobs on a real multi-node Ray cluster on this machine: a sweep of 8 bench jobs of the shipped toy pair (its two
EAGLE-3 drafters x K in {1, 2} x T in {0, 0.7}) over two one-CPU nodes of ray.cluster_utils.Cluster, every run
complete in the catalog."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from backend.config import REPO_ROOT
from backend.store.data_root import DataRoot

ray = pytest.importorskip("ray")

PROMPTS = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """The toy pair shipped in models/toy-pair.tar.gz (target 8 layers x 256, drafter-matched, drafter-after-layer)."""
    from backend.demo import PAIR_TARBALL, toy_pair

    if not PAIR_TARBALL.exists():
        pytest.skip(f"{PAIR_TARBALL} missing")
    return toy_pair(DataRoot(tmp_path_factory.mktemp("ray-pair")))


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each on this machine (a head and a worker node), shared by this module's tests."""
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as mp:
        # the nodes' Ray workers import backend.*: they inherit this environment
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                          "object_store_memory": 80 * 2**20})
        c.add_node(num_cpus=1, object_store_memory=80 * 2**20)
        c.wait_for_nodes()
        yield c
        ray.shutdown()
        c.shutdown()


def test_ray_sweep_of_8_toy_pair_jobs_over_2_nodes(cluster, data_root, pair, monkeypatch):
    from backend.jobs import queue
    from backend.jobs.cli import submit_spec
    from backend.jobs.worker import run_ray

    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", str(pair))
    drafters = [pair / "drafter-matched", pair / "drafter-after-layer"]
    jobs = submit_spec({"kind": "sweep", "name": "rs", "target": str(pair / "target"),
                        "drafters": [str(d) for d in drafters],
                        "num_spec_tokens": [1, 2], "temperature": [0, 0.7], "prompts": str(PROMPTS), "limit": 2,
                        "repeats": 1, "max_new_tokens": 8, "device": "cpu", "num_cpus": 1, "num_gpus": 0},
                       data=DataRoot(data_root))
    assert len(jobs) == 8
    t0 = time.monotonic()
    logs: list[str] = []
    assert run_ray(cluster.address, DataRoot(data_root), once=True, log=logs.append) == 8
    took = time.monotonic() - t0
    assert len(ray.nodes()) == 2 and all(n["Alive"] for n in ray.nodes())
    states = {j["job_id"]: queue.find(j["job_id"], DataRoot(data_root))[0] for j in jobs}
    assert set(states.values()) == {"done"}, (states, logs)
    # the tasks ran in Ray workers spread over both nodes (one CPU each), not in this process
    results = [queue.find(j["job_id"], DataRoot(data_root))[1]["result"] for j in jobs]
    pids = {json.loads((data_root / "runs" / r["run"] / "manifest.json").read_text())["pid"] for r in results}
    assert os.getpid() not in pids and len(pids) >= 2
    DataRoot(data_root).catalog.write.refresh()
    runs = DataRoot(data_root).catalog.read.list_runs()
    ours = runs[runs["run_id"].str.startswith("rs-")]
    # 8 sweep runs + one paired baseline per temperature, shared by the jobs that started together on two nodes
    assert len(ours) == 8 + 2, sorted(ours["run_id"])
    assert (runs["status"] == "complete").all(), runs[["run_id", "status"]]
    bench = DataRoot(data_root).catalog.read.bench_runs().set_index("run_id")
    for j in jobs:
        assert bench.loc[j["job_id"], "baseline_run"] in set(runs["run_id"])
    greedy = [j["job_id"] for j in jobs if j["settings"]["temperature"] == 0.0]
    assert all(bench.loc[g, "lossless"] for g in greedy)       # greedy speculative == plain decoding, per job
    print(f"ray sweep: 8 jobs, {len(runs)} runs, {took:.1f} s on 2 nodes")


def test_ray_cancel_ends_the_task_and_fails_its_run(cluster, data_root, tiny_llama, monkeypatch):
    import threading

    from backend.jobs import queue
    from backend.jobs.cli import submit_spec
    from backend.jobs.worker import run_ray

    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", str(tiny_llama.parent))
    submit_spec({"kind": "bench", "name": "ray-long", "target": str(tiny_llama), "prompts": str(PROMPTS), "limit": 20,
                 "repeats": 5, "max_new_tokens": 64, "device": "cpu", "num_cpus": 1}, data=DataRoot(data_root))
    man = data_root / "runs" / "ray-long" / "manifest.json"
    seen: list[str] = []

    def cancel_when_running() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if man.exists() and json.loads(man.read_text())["status"] == "running":
                seen.append(queue.cancel("ray-long", DataRoot(data_root)))
                return
            time.sleep(0.1)

    t = threading.Thread(target=cancel_when_running)
    t.start()
    assert run_ray(cluster.address, DataRoot(data_root), once=True, poll_s=0.2, log=lambda s: None) == 1
    t.join()
    assert seen == ["cancelling"]
    st, job = queue.find("ray-long", DataRoot(data_root))
    assert st == "cancelled" and job["error"] == "cancelled"
    m = DataRoot(data_root).run_dir("ray-long").manifest()
    assert m["status"] == "failed" and "cancelled" in m["error"] and m["progress"]["done"] < 100
