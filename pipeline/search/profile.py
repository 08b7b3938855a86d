"""Where the time goes: a ``torch.profiler`` trace and a top-operators table per Pareto trial.

The trace is Chrome trace JSON (open it in https://ui.perfetto.dev or chrome://tracing); the
table is ``key_averages()`` sorted by self time. CUDA adds the CUDA activity. On MPS the
timeline also gets ``torch.mps.profiler`` signposts (view them in Xcode Instruments); that
path is unverified without a Mac, and the files say so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from paretorch.pipeline.core.spec import Batch

TRACE_FILE = "profile_trace.json"
TABLE_FILE = "profile_top_ops.txt"
MPS_NOTE = ("MPS: torch.mps.profiler signposts were recorded around these calls (Xcode Instruments); "
            "this path is unverified without a Mac.\n")


def profile_calls(fn: Callable[..., Tensor], inputs: Batch, device: torch.device, folder: Path,
                  calls: int = 10, warmup: int = 3) -> list[Path]:
    """Profile ``calls`` forward calls after ``warmup``; write the trace and the table into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    with torch.no_grad():
        for _ in range(warmup):
            fn(*inputs)
        mps_profiler = getattr(getattr(torch, "mps", None), "profiler", None) if device.type == "mps" else None
        with torch_profile(activities=activities, record_shapes=True) as prof:
            if mps_profiler is not None:
                with mps_profiler.profile(mode="interval", wait_until_completed=True):
                    for _ in range(calls):
                        fn(*inputs)
            else:
                for _ in range(calls):
                    fn(*inputs)
    trace = folder / TRACE_FILE
    prof.export_chrome_trace(str(trace))
    table = folder / TABLE_FILE
    header = f"torch.profiler, {calls} calls on {device.type}, sorted by {sort_by}\n"
    table.write_text(header + (MPS_NOTE if device.type == "mps" else "")
                     + prof.key_averages().table(sort_by=sort_by, row_limit=25))
    return [trace, table]
