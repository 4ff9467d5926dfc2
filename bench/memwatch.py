"""Run a benchmark child process and watch the memory of its whole process tree (Linux ``/proc``).

Every 50 ms: the sum of RSS and of PSS over the tree (PSS divides shared pages -- e.g. the numpy and torch
libraries every process maps -- among the processes that share them, so the PSS sum is the tree's real
footprint; the RSS sum counts shared pages once per process). Also each process's VmHWM (the kernel-tracked
peak RSS), which sampling cannot miss.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field

from flows.mirror import REPO


def hwm_kb(pid: int) -> int:
    """VmHWM (peak RSS of the process's current image) in KiB from /proc; 0 if unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Watched:
    stdout: str
    returncode: int
    peak_rss_mb: float = 0.0  # the largest sum of RSS over the tree at one sample
    peak_pss_mb: float = 0.0  # the same for PSS
    hwm_kb: dict[int, int] = field(default_factory=dict)  # pid -> VmHWM

    @property
    def sum_vmhwm_mb(self) -> float:
        return sum(self.hwm_kb.values()) / 1024

    @property
    def largest_process_mb(self) -> float:
        return max(self.hwm_kb.values(), default=0) / 1024


def run_watched(cmd: list[str], pss: bool = False) -> Watched:
    """Run ``cmd`` in the repository root (stdout captured) and sample its process tree until it exits.
    ``pss=True`` also sums PSS (slower per sample: it reads smaps)."""
    import psutil

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    ps = psutil.Process(proc.pid)
    peak_rss = peak_pss = 0
    hwm: dict[int, int] = {}
    while proc.poll() is None:
        rss = pss_sum = 0
        try:
            procs = [ps] + ps.children(recursive=True)
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                if pss:
                    mi = p.memory_full_info()
                    rss += mi.rss
                    pss_sum += mi.pss
                else:
                    rss += p.memory_info().rss
                hwm[p.pid] = max(hwm.get(p.pid, 0), hwm_kb(p.pid))
            except psutil.Error:
                pass
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss_sum)
        time.sleep(0.05)
    return Watched(proc.stdout.read(), proc.returncode, peak_rss / 2**20, peak_pss / 2**20, hwm)
