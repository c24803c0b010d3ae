"""Where a GPU code path spends its time: torch.profiler tables and the host syncs it makes (benchmarks only).

    with profile_region(device, rows=30) as report:
        ...                                   # the region
    report["tables"], report["syncs"]         # kernel / host-op tables (text); syncing call sites by count

The sync sites come from `torch.cuda.set_sync_debug_mode("warn")`: every op that makes the host wait for the GPU
(`.item()`, `int(tensor)`, a D2H copy, `nonzero`, ...) warns; the stack is cut to the package's frames and counted.
A path that is overhead-bound (short kernels, the host launching them) shows it as a GPU total far below its wall
time and as many syncs, each of which drains the launch queue.
"""

from __future__ import annotations

import collections
import contextlib
import traceback
import warnings

import torch

PACKAGE_FRAMES = ("infinitehip/",)  # stack frames kept in a sync site (the caller's code, not torch's)


def _site(stack: list[traceback.FrameSummary]) -> str:
    """The innermost three package frames of a stack, innermost last: 'file:line func <- ...'."""
    frames = [f for f in stack if any(p in f.filename for p in PACKAGE_FRAMES)]
    return " <- ".join(f"{f.filename.split('infinitehip/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(frames[-3:]))


@contextlib.contextmanager
def profile_region(device: torch.device, rows: int = 30, syncs: bool = True):
    """Profile the block: yields a dict filled on exit with `tables` (by device time and by host time), `syncs`
    ({site: count}, most frequent first) and `sync_count`. On a CPU device only the host table is filled."""
    report: dict = {}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    sites: collections.Counter = collections.Counter()
    show = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" in str(message):
            sites[_site(traceback.extract_stack()[:-1])] += 1
        else:
            show(message, category, filename, lineno, file, line)

    prof = torch.profiler.profile(activities=activities)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        watch = syncs and device.type == "cuda"
        if watch:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            with prof:
                yield report
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
        finally:
            if watch:
                torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = show
    averages = prof.key_averages()
    keys = (["self_device_time_total"] if device.type == "cuda" else []) + ["self_cpu_time_total"]
    report["tables"] = {k: averages.table(sort_by=k, row_limit=rows, max_name_column_width=70) for k in keys}
    report["syncs"] = dict(sites.most_common())
    report["sync_count"] = sum(sites.values())


def print_report(report: dict, title: str, sites: int = 25) -> None:
    for key, table in report.get("tables", {}).items():
        print(f"{title}, by {key}:\n{table}", flush=True)
    if report.get("syncs"):
        print(f"{title}: {report['sync_count']} host syncs; sites by count:", flush=True)
        for site, n in list(report["syncs"].items())[:sites]:
            print(f"  {n:5d}  {site}", flush=True)
