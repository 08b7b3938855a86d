"""CPU seconds of subprocesses, for tests that bound how much work something costs: CPU time, not wall time, so a
loaded machine (CI's two cores running other jobs) cannot fail them."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's waited-for children (``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a running process has used so far, with its waited-for children's
    (``/proc/PID/stat``: utime, stime, cutime, cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Stopped:
    """How a subprocess ended after a signal: its output, and the CPU and wall seconds from the signal to its exit."""

    output: str
    cpu_seconds: float
    wall_seconds: float


def stop(process: subprocess.Popen[str], send: Callable[[], None], timeout: float) -> Stopped:
    """Call ``send`` (which signals ``process``), wait for the process to end and measure what that cost."""
    start, before = time.monotonic(), process_cpu_seconds(process.pid) + children_cpu_seconds()
    send()
    output = process.communicate(timeout=timeout)[0]
    return Stopped(output, children_cpu_seconds() - before, time.monotonic() - start)
