"""The machine's load beside a measurement, read with psutil: `LoadProbe` times what else used the CPU while each
bench unit ran (other processes, other SpecLens processes); `is_speclens` tells a SpecLens process by its command
line (the serving-load bench counts them beside each level with the same rule)."""

from __future__ import annotations

import os
import time


class LoadProbe:
    """The machine's load while one unit ran (psutil): `load1` (1-minute load average at its end), `cpu_util` (system
    CPU utilisation, %), `other_cpu` (cores other processes used: system busy time minus this process and its
    children, over the unit's wall time), `speclens_cpu` (cores other SpecLens processes used: a command line running
    the `backend` package, this process, its ancestors (a job worker) and its children left out) and
    `speclens_procs` (those that used 0.05 core or more: "pid command"). The process table is read again at most
    every RESCAN_S seconds."""

    RESCAN_S = 2.0

    def __init__(self):
        import psutil

        self.ps = psutil
        self.cpus = psutil.cpu_count() or 1
        self.me = psutil.Process()
        self.mine = {self.me.pid} | {p.pid for p in self._ancestors()}
        self.others: dict[int, tuple[object, str]] = {}
        self.scanned = -1e9
        self.t0 = self.sys0 = self.own0 = None
        self.cpu0: dict[int, float] = {}

    def _ancestors(self):
        try:
            return self.me.parents()
        except self.ps.Error:
            return []

    @staticmethod
    def is_speclens(cmdline: list[str]) -> bool:
        """A command line that runs the `backend` package: `-m backend ...`, `-m backend.<module>`, a path to
        backend/__main__.py, or `-c` code importing it (a multiprocessing forkserver that preloads it)."""
        for k, a in enumerate(cmdline[:-1]):
            nxt = cmdline[k + 1]
            if a == "-m" and (nxt == "backend" or nxt.startswith("backend.")):
                return True
            if a == "-c" and ("'backend" in nxt or "import backend" in nxt or "from backend" in nxt):
                return True
        return any(x.endswith(("backend/__main__.py", "backend/demo.py")) for x in cmdline)

    def _scan(self) -> None:
        kids = {c.pid for c in self._children()}
        others = {}
        for p in self.ps.process_iter(["pid", "cmdline"]):
            pid, cmd = p.info["pid"], p.info.get("cmdline") or []
            if pid in self.mine or pid in kids or not self.is_speclens(cmd):
                continue
            others[pid] = self.others.get(pid) or (p, " ".join(cmd)[:160])
        self.others, self.scanned = others, time.monotonic()

    def _children(self):
        try:
            return self.me.children(recursive=True)
        except self.ps.Error:
            return []

    def _own(self) -> float:
        t = 0.0
        for p in [self.me, *self._children()]:
            try:
                c = p.cpu_times()
                t += c.user + c.system
            except self.ps.Error:
                pass
        return t

    @staticmethod
    def _busy(c) -> float:
        return sum(c) - c.idle - getattr(c, "iowait", 0.0)

    def _cpu(self, p) -> float | None:
        try:
            c = p.cpu_times()
            return c.user + c.system
        except self.ps.Error:
            return None

    def start(self) -> None:
        if time.monotonic() - self.scanned > self.RESCAN_S:
            self._scan()
        self.ps.cpu_percent(None)
        self.t0, self.sys0, self.own0 = time.monotonic(), self._busy(self.ps.cpu_times()), self._own()
        self.cpu0 = {pid: c for pid, (p, _) in self.others.items() if (c := self._cpu(p)) is not None}

    def stop(self) -> dict:
        wall = max(time.monotonic() - self.t0, 1e-6)
        busy = self._busy(self.ps.cpu_times()) - self.sys0
        own = self._own() - self.own0
        used, names = 0.0, []
        for pid, c0 in self.cpu0.items():
            p, cmd = self.others[pid]
            c1 = self._cpu(p)
            if c1 is not None and c1 >= c0:
                used += c1 - c0
                if (c1 - c0) / wall >= 0.05:
                    names.append(f"{pid} {cmd}")
        return {"load1": os.getloadavg()[0], "cpu_util": self.ps.cpu_percent(None),
                "other_cpu": max(busy - own, 0.0) / wall, "speclens_cpu": used / wall,
                "speclens_procs": "; ".join(names) or None}
