"""Timing helpers shared by the benchmarks: wall-clock samples and device
time from the JAX profiler.

Wall time: each sample dispatches a jitted function back to back (JAX
dispatches asynchronously) and waits for the last result, so the host's
dispatch overlaps the device work as it does in a training loop.

Device time: the JAX profiler's trace (xplane) of a few runs; the GPU's
kernels and copies are read from the device plane's "Stream" lines and
summed (busy time: gaps between kernels do not count). Several programs
share one trace: each runs inside a named ``TraceAnnotation`` and waits for
its results before the window closes, so a kernel belongs to the program
whose window contains it (host and device timestamps share the trace's
clock). If the windows do not account for every kernel, each program is
traced on its own instead (slower, and needs no clock alignment).
"""

from __future__ import annotations

import glob
import math
import shutil
import statistics
import tempfile
import time

import jax
from jax import lax

_WINDOW = "jcc-bench:"


def block(out):
    jax.block_until_ready(out)


_block = block  # the name the probes import


def sample(f, args, calls):
    """Seconds to dispatch f(*args) `calls` times back to back and wait for the last."""
    t0 = time.perf_counter()
    for _ in range(calls):
        out = f(*args)
    block(out)
    return time.perf_counter() - t0


_sample = sample


def timeit(f, *args, reps=50, warmup=5, inner=1, calls=1, min_sample_s=0.0, max_s=None):
    """Median seconds per call of f (already jitted); inner = calls per f.

    Each sample dispatches f `calls` times back to back (asynchronously) and
    waits for the last, so host dispatch and synchronisation are amortised.
    With min_sample_s, `calls` grows until a sample lasts that long: a
    sample's first dispatch and final wait (a few hundred us on a GPU) are
    then a small share of it, for every impl alike. With max_s, fewer
    samples (at least 3) are taken when `reps` of them would last longer.
    """
    for _ in range(warmup):
        block(f(*args))
    t = None
    if min_sample_s > 0 or max_s is not None:
        t = sample(f, args, calls)
        if min_sample_s > 0:
            calls = max(calls, math.ceil(calls * min_sample_s / max(t, 1e-9)))
            t = max(t, min_sample_s)
    if max_s is not None:
        reps = max(3, min(reps, int(max_s / max(t, 1e-9))))
    ts = [sample(f, args, calls) for _ in range(reps)]
    return statistics.median(ts) / (inner * calls)


def timeit_interleaved(programs, reps=7, min_sample_s=0.0, max_s=1.0, min_reps=3):
    """Median seconds per call of each program, the samples taken in rounds
    (one sample of every program per round), so that a change in the host's
    load over the run falls on all of them alike. programs: {key: (f, args,
    inner)}, each already run once. Each program's samples are `calls`
    back-to-back calls, as many as make a sample last min_sample_s; rounds
    stop after `reps`, or once they have taken max_s per program (at least
    min_reps rounds)."""
    calls, t1 = {}, {}
    for k, (f, args, _) in programs.items():
        t = sample(f, args, 1)
        calls[k] = max(1, math.ceil(min_sample_s / max(t, 1e-9))) if min_sample_s > 0 else 1
        t1[k] = t * calls[k]
    per_round = sum(t1.values())
    rounds = max(min_reps, min(reps, int(max_s * len(programs) / max(per_round, 1e-9))))
    ts = {k: [] for k in programs}
    for _ in range(rounds):
        for k, (f, args, _) in programs.items():
            ts[k].append(sample(f, args, calls[k]) / calls[k])
    return {k: statistics.median(v) / programs[k][2] for k, v in ts.items()}


def timeit_pair(f, g, args, reps=25, warmup=3, calls=1):
    """Median seconds per call of f and of g, and the median of their
    difference, from samples taken in alternation (f, g, f, g, ...), so that
    drift in host speed over the run falls on both alike."""
    for _ in range(warmup):
        block(f(*args))
        block(g(*args))
    tf, tg = [], []
    for _ in range(reps):
        tf.append(sample(f, args, calls) / calls)
        tg.append(sample(g, args, calls) / calls)
    return (statistics.median(tf), statistics.median(tg),
            statistics.median([a - b for a, b in zip(tf, tg)]))


def looped(fn, n):
    """Jitted loop of n dependent calls (x -> fn(x))."""
    @jax.jit
    def f(x, *rest):
        return lax.fori_loop(0, n, lambda i, x: fn(x, *rest).astype(x.dtype), x)
    return f


def batched(fn):
    """One jitted program calling fn on each of several inputs (independent
    calls, no loop): for small, launch-bound shapes, the device time per call
    without a host dispatch per call (a loop would add a carry copy for every
    impl that is not fused into the carry update)."""
    @jax.jit
    def f(xs, *rest):
        return [fn(x, *rest) for x in xs]
    return f


def trace_session(body):
    """The JAX profiler's planes (host and device timelines) while body()
    runs; [] when the profiler wrote no trace."""
    d = tempfile.mkdtemp(prefix="jcc-trace-")
    try:
        jax.profiler.start_trace(d)
        try:
            body()
        finally:
            jax.profiler.stop_trace()
        paths = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        return list(jax.profiler.ProfileData.from_file(paths[0]).planes) if paths else []
    finally:
        shutil.rmtree(d, ignore_errors=True)


def trace_planes(f, *args, n=10):
    """The planes of n back-to-back runs of f(*args), after one untraced run."""
    block(f(*args))

    def body():
        out = None
        for _ in range(n):
            out = f(*args)
        block(out)
    return trace_session(body)


def stream_events(planes):
    """GPU kernels and copies in a trace: (name, start_ns, end_ns) sorted by
    start; [] where the trace has no GPU stream lines (a CPU run)."""
    ev = []
    for plane in planes:
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if line.name.startswith("Stream"):  # not the XLA op/module summaries
                    ev.extend((e.name, e.start_ns, e.end_ns) for e in line.events)
    return sorted(ev, key=lambda t: t[1])


def device_events(f, *args, n=10):
    """GPU kernels and copies of n back-to-back runs of f(*args)."""
    return stream_events(trace_planes(f, *args, n=n))


def device_busy_us(f, *args, n=10):
    """Microseconds per run of f that the GPU spends executing (kernels and
    copies, gaps excluded); nan without a GPU trace."""
    ev = device_events(f, *args, n=n)
    return sum(e - s for _, s, e in ev) / 1e3 / n if ev else float("nan")


def _windows(planes):
    out = {}
    for plane in planes:
        if plane.name.startswith("/host:"):
            for line in plane.lines:
                for e in line.events:
                    if e.name.startswith(_WINDOW):
                        out[e.name[len(_WINDOW):]] = (e.start_ns, e.end_ns)
    return out


def attribute(events, windows):
    """Splits kernels among program windows: {key: [events]} for the events
    lying inside each window, and the number that lie in none."""
    out = {k: [] for k in windows}
    spans = sorted((s, e, k) for k, (s, e) in windows.items())
    orphans = 0
    for ev in events:
        for s, e, k in spans:
            if s <= ev[1] and ev[2] <= e:
                out[k].append(ev)
                break
        else:
            orphans += 1
    return out, orphans


def device_times(programs, n=5, log=None):
    """Device busy microseconds per call for each program, from one trace.

    programs: {key: (f, args, inner)} (inner = calls per run of f); every f
    already compiled and run once. Returns {key: us per call}; {} without a
    GPU trace (CPU). Falls back to one trace per program when the shared
    trace's windows miss kernels or a window holds none."""
    if not programs:
        return {}
    keys = list(programs)
    if not _shared_trace_ok[0]:
        return _traced_alone(programs, keys, n)

    def body():
        for i, k in enumerate(keys):
            f, args, _ = programs[k]
            with jax.profiler.TraceAnnotation(f"{_WINDOW}{i}"):
                out = None
                for _ in range(n):
                    out = f(*args)
                block(out)
    planes = trace_session(body)
    events = stream_events(planes)
    if not events:
        return {}
    by_idx, orphans = attribute(events, _windows(planes))
    got = {k: by_idx.get(str(i), []) for i, k in enumerate(keys)}
    if orphans or any(not v for v in got.values()):
        if log is not None:
            log(f"device time: {orphans} kernels outside the program windows, or a window "
                "without kernels; from now on each program is traced on its own")
        _shared_trace_ok[0] = False
        return _traced_alone(programs, keys, n)
    return {k: sum(e - s for _, s, e in got[k]) / 1e3 / n / programs[k][2] for k in keys}


_shared_trace_ok = [True]   # False once a shared trace failed to attribute its kernels


def _traced_alone(programs, keys, n):
    out = {}
    for k in keys:
        f, args, inner = programs[k]
        ev = device_events(f, *args, n=n)
        out[k] = sum(e - s for _, s, e in ev) / 1e3 / n / inner if ev else None
    return out
