"""Memory, CPU and wall time of one whole ``cfree run``, measured from outside.

Runs ``cfree run --json`` with the given ``--set`` overrides and, every ``--every`` seconds
while it runs, reads ``/proc/PID/smaps_rollup`` of every process under it: the launcher, the
fork server and the peers (the fork server's children). PSS counts a page shared by k
processes as 1/k to each, so the sum over all processes is the memory the run really takes.
Reported: the peak of the peers' summed PSS (and per peer, with the peer count at that
sample), the peak of the whole tree's, the peak RSS of one peer, the peak growth of the
kernel's own memory for them (page tables, kernel stacks, unreclaimable slab: not in any
PSS), the drop of MemAvailable from before the start (the whole machine's: other work
counts too), CPU seconds (user + system of the launcher and every process under it,
from its rusage), wall seconds, whether the run was fault-free and its difference from the
simulator (from the run's own summary), and the load average at the start and the end.

Run: ``python bench/bench_run_memory.py --set graph.nodes=256 --set protocol.steps=20``
(``--json`` for one JSON object). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def rollup(pid: int) -> dict[str, int]:
    """Pss, Rss, Private_Dirty ... of ``pid`` in bytes ({} when it is gone)."""
    out = {}
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return out
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0]) * 1024
    return out


def children_of() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kids.setdefault(int(stat[1]), []).append(int(d))
    return kids


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0]) * 1024
    return out


#: Kernel memory a process costs beyond its pages (not in PSS): its page tables, its kernel
#: stack, and the unreclaimable slab of its sockets, pipes and descriptors.
KERNEL = ("PageTables", "KernelStack", "SUnreclaim")


class Sampler(threading.Thread):
    """Samples the process tree under ``root`` until stopped; keeps the peaks."""

    def __init__(self, root: int, every: float):
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self.stop = threading.Event()
        info = meminfo()
        self.avail0 = info["MemAvailable"]
        self.kernel0 = sum(info.get(k, 0) for k in KERNEL)
        self.peak = {"tree_pss": 0, "peers_pss": 0, "peers": 0, "peer_rss": 0, "server_pss": 0,
                     "launcher_pss": 0, "avail_drop": 0, "peer_private_dirty": 0,
                     "kernel": 0, "kernel_peers": 0}  # fmt: skip
        self.samples = 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.every)

    def sample(self) -> None:
        kids = children_of()
        launcher = rollup(self.root)
        tree = launcher.get("Pss", 0)
        peers_pss = peers_dirty = peer_rss = server_pss = npeers = 0
        for server in kids.get(self.root, []):
            srv = rollup(server)
            server_pss = max(server_pss, srv.get("Pss", 0))
            tree += srv.get("Pss", 0)
            for peer in kids.get(server, []):
                r = rollup(peer)
                if not r:
                    continue
                npeers += 1
                peers_pss += r.get("Pss", 0)
                peers_dirty += r.get("Private_Dirty", 0)
                peer_rss = max(peer_rss, r.get("Rss", 0))
        tree += peers_pss
        self.samples += 1
        p = self.peak
        info = meminfo()
        kernel = sum(info.get(k, 0) for k in KERNEL) - self.kernel0
        if kernel > p["kernel"]:
            p.update(kernel=kernel, kernel_peers=npeers)
        if peers_pss > p["peers_pss"]:
            p.update(peers_pss=peers_pss, peers=npeers, peer_private_dirty=peers_dirty)
        p["tree_pss"] = max(p["tree_pss"], tree)
        p["peer_rss"] = max(p["peer_rss"], peer_rss)
        p["server_pss"] = max(p["server_pss"], server_pss)
        p["launcher_pss"] = max(p["launcher_pss"], launcher.get("Pss", 0))
        p["avail_drop"] = max(p["avail_drop"], self.avail0 - info["MemAvailable"])


def measure(sets: list[str], every: float, extra: list[str]) -> dict:
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cfree-memrun-") as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "coordinator_free", "run", "--json", "--out", str(out)]
        for s in sets:
            argv += ["--set", s]
        argv += extra
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampler = Sampler(proc.pid, every)
        sampler.start()
        stdout, stderr = proc.communicate()
        wall = time.monotonic() - t0
        sampler.stop.set()
        sampler.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            summary = json.loads(stdout)
        except ValueError:
            summary = {}
    peak = sampler.peak
    mib = 2**20
    return {
        "sets": sets,
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "peers_wall_s": round(summary.get("wall_s", float("nan")), 1),
        "cpu_user_s": round(after.ru_utime - before.ru_utime, 1),
        "cpu_sys_s": round(after.ru_stime - before.ru_stime, 1),
        "peak_peers_pss_mib": round(peak["peers_pss"] / mib, 1),
        "peers_at_peak": peak["peers"],
        "pss_per_peer_mib": round(peak["peers_pss"] / mib / max(1, peak["peers"]), 2),
        "private_dirty_per_peer_mib": round(
            peak["peer_private_dirty"] / mib / max(1, peak["peers"]), 2
        ),
        "peak_peer_rss_mib": round(peak["peer_rss"] / mib, 1),
        "peak_server_pss_mib": round(peak["server_pss"] / mib, 1),
        "peak_launcher_pss_mib": round(peak["launcher_pss"] / mib, 1),
        "peak_tree_pss_mib": round(peak["tree_pss"] / mib, 1),
        "peak_kernel_growth_mib": round(peak["kernel"] / mib, 1),
        "peers_at_kernel_peak": peak["kernel_peers"],
        "kernel_per_peer_mib": round(peak["kernel"] / mib / max(1, peak["kernel_peers"]), 2),
        "peak_memavailable_drop_mib": round(peak["avail_drop"] / mib, 1),
        "samples": sampler.samples,
        "failed": len(summary.get("failed", [])) if summary else None,
        "completed_as_planned": summary.get("completed_as_planned"),
        "simulator_max_abs_diff": summary.get("simulator_max_abs_diff"),
        "load_start": [round(x, 2) for x in load0],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "stderr_tail": stderr.strip().splitlines()[-3:] if proc.returncode else [],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between samples (0.5)")
    ap.add_argument("--no-audit", action="store_true", help="pass --no-audit to cfree run")
    ap.add_argument(
        "--no-memory-check", action="store_true", help="pass --no-memory-check to cfree run"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    extra = ["--no-audit"] * args.no_audit + ["--no-memory-check"] * args.no_memory_check
    res = measure(args.set, args.every, extra)
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:30} {v}")
    return 0 if res["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
