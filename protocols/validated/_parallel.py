"""Per-report verification spread over the machine's cores.

Each report's Prio3 verification is a pure function of public inputs and the aggregator's
keys, so the aggregators may check many reports at once; the results, their order and every
refusal reason are those of the serial loop (tested). Workers come from loky's reusable
executor (the process pool joblib ships), started on first use and kept for later rounds.
"""

from __future__ import annotations

import os

#: fewest reports worth the workers (below: the serial loop, in process)
MIN_REPORTS = 128


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _run_chunk(fn, shared, chunk):
    return [fn(*shared, *args) for args in chunk]


def map_reports(fn, shared: tuple, args: list[tuple]) -> list:
    """``[fn(*shared, *a) for a in args]``, in order; in chunks over the cores when worth it.
    ``fn`` must be a module-level function (it is sent to the workers)."""
    n = cpus()
    if n < 2 or len(args) < MIN_REPORTS:
        return _run_chunk(fn, shared, args)
    from joblib.externals.loky import get_reusable_executor

    executor = get_reusable_executor(max_workers=n, timeout=300)
    size = -(-len(args) // n)
    futures = [executor.submit(_run_chunk, fn, shared, args[i:i + size]) for i in range(0, len(args), size)]
    out: list = []
    for f in futures:
        out += f.result()
    return out
