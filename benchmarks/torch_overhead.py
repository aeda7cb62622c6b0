"""Host time per call of the torch adapter's eager path, against PyTorch's
own op bindings and (when importable) Dao-AILab's ``causal_conv1d``.

    python -m benchmarks.torch_overhead --device cuda     # on a GPU machine
    python -m benchmarks.torch_overhead --device cpu
    python -m benchmarks.torch_overhead --device cuda --large 1,8192,2048

With ``--large B,L,D`` it times instead one channel-last bfloat16 forward of
that size (W=4, SiLU, no grad) three ways: waiting for each call (what
benchmarks/bench_torch.py reports: host time before the launch counts),
back to back (CUDA events around many calls: the device's time per call
once the host keeps ahead), and the host time of one call; for the adapter,
F.conv1d and Dao's causal_conv1d_fn, and jax_causal_conv through JAX when
JAX has a GPU (sharing the device: JAX's preallocation is turned off).

Tensors are tiny, so the kernels' own time is negligible and what is timed
is the host's: argument checks, allocations, the dispatcher (or its bypass)
and the launch. Each call is timed alone with ``time.perf_counter_ns``
(no synchronisation inside the timed region; the device is synchronised
between rounds; on CPU torch runs one intra-op thread), and the median and
90th percentile over all calls are reported, together with the CPU time per call that ``torch.profiler`` sees
for the same calls (a ``record_function`` range around each). No result is
asserted: this prints a table (markdown with ``--markdown``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _cases(torch, device, dtype):
    """(name, {impl: callable}) pairs on the same tensors (grad mode on:
    only the cases whose inputs require grad build graphs)."""
    import torch.nn.functional as F

    import jax_causal_conv.torch as jt

    try:  # Dao-AILab causal-conv1d, when installed (CUDA only)
        from causal_conv1d import causal_conv1d_fn as dao_fn
        from causal_conv1d import causal_conv1d_update as dao_update
    except Exception:  # not installed, or its extension does not load
        dao_fn = dao_update = None
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    B, D, L, W = 1, 64, 16, 4
    x, w, b = rnd(B, D, L), rnd(D, W), rnd(D)
    x_cl = rnd(B, L, D).transpose(1, 2)
    init = rnd(B, W - 1, D).transpose(1, 2)
    xz = rnd(B, 2 * D, L)
    x_half = xz.chunk(2, dim=1)[0]
    token = rnd(8, D)
    state = rnd(8, D, W - 1)
    state_cl = rnd(8, W - 1, D).transpose(1, 2)
    w1 = w[:, None]
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))

    def conv1d(x):  # one PyTorch op binding on the same tensors
        return F.conv1d(x, w1, b, padding=W - 1, groups=D)

    cases = [
        ("forward (1,64,16), silu", {
            "jax_causal_conv.torch": lambda: jt.causal_conv1d_fn(x, w, b, activation="silu"),
            "F.conv1d": lambda: conv1d(x),
            "Dao causal_conv1d_fn": dao_fn and (lambda: dao_fn(x, w, b, activation="silu"))}),
        ("forward (1,64,16), inputs require grad", {
            "jax_causal_conv.torch": lambda: jt.causal_conv1d_fn(xg, wg, bg, activation="silu"),
            "F.conv1d": lambda: F.conv1d(xg, wg[:, None], bg, padding=W - 1, groups=D),
            "Dao causal_conv1d_fn": dao_fn and (lambda: dao_fn(xg, wg, bg, activation="silu"))}),
        ("forward channel-last", {
            "jax_causal_conv.torch": lambda: jt.causal_conv1d_fn(x_cl, w, b, activation="silu"),
            "F.conv1d": lambda: conv1d(x_cl),
            "Dao causal_conv1d_fn": dao_fn and (lambda: dao_fn(x_cl, w, b, activation="silu"))}),
        ("forward channel-last, states in and out", {
            "jax_causal_conv.torch": lambda: jt.causal_conv1d_fn(
                x_cl, w, b, initial_states=init, return_final_states=True, activation="silu"),
            "Dao causal_conv1d_fn": dao_fn and (lambda: dao_fn(
                x_cl, w, b, initial_states=init, return_final_states=True, activation="silu"))}),
        ("forward x = xz.chunk(2, dim=1)[0]", {
            "jax_causal_conv.torch": lambda: jt.causal_conv1d_fn(x_half, w, b, activation="silu"),
            "F.conv1d": lambda: conv1d(x_half),
            "Dao causal_conv1d_fn": dao_fn and (lambda: dao_fn(x_half, w, b, activation="silu"))}),
        ("decode update (8,64), state (8,64,3)", {
            "jax_causal_conv.torch": lambda: jt.causal_conv1d_update(token, state, w, b, "silu"),
            "F.conv1d": lambda: F.conv1d(state, w1[..., 1:], b, groups=D),
            "Dao causal_conv1d_update": dao_update and (lambda: dao_update(token, state, w, b, "silu"))}),
        ("decode update, channel-last state", {
            "jax_causal_conv.torch": lambda: jt.causal_conv1d_update(token, state_cl, w, b, "silu"),
            "Dao causal_conv1d_update": dao_update and (lambda: dao_update(token, state_cl, w, b, "silu"))}),
    ]
    return [(name, {k: v for k, v in impls.items() if v}) for name, impls in cases]


def _time(torch, fn, sync, calls, rounds):
    """Per-call host times in microseconds (median, p90) and the profiler's
    CPU time per call."""
    for _ in range(50):
        fn()
    sync()
    ts = []
    for _ in range(rounds):
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            fn()
            ts.append(time.perf_counter_ns() - t0)
        sync()
    ts.sort()
    med, p90 = statistics.median(ts) / 1e3, ts[int(0.9 * (len(ts) - 1))] / 1e3
    from torch.profiler import ProfilerActivity, profile, record_function

    n = min(calls, 200)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            with record_function("one_call"):
                fn()
        sync()
    ev = [e for e in prof.key_averages() if e.key == "one_call"]
    prof_us = ev[0].cpu_time_total / ev[0].count if ev else float("nan")
    return med, p90, prof_us


def _large(torch, shape, calls):
    """Rows (impl, waited us, back-to-back us, host us) for a channel-last
    bf16 forward of shape (B, L, D)."""
    import torch.nn.functional as F

    import jax_causal_conv.torch as jt

    B, L, D = shape
    W = 4
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, L, D, generator=gen).to("cuda", torch.bfloat16).transpose(1, 2)
    w = torch.randn(D, W, generator=gen).to("cuda", torch.bfloat16)
    b = torch.randn(D, generator=gen).to("cuda", torch.bfloat16)
    impls = {"jax_causal_conv.torch": lambda: jt.causal_conv1d_fn(x, w, b, activation="silu"),
             "F.conv1d": lambda: F.conv1d(x, w[:, None], b, padding=W - 1, groups=D)}
    try:
        from causal_conv1d import causal_conv1d_fn as dao_fn

        impls["Dao causal_conv1d_fn"] = lambda: dao_fn(x, w, b, activation="silu")
    except Exception:
        pass
    sync = torch.cuda.synchronize
    rows = []
    for name, fn in impls.items():
        rows.append((name, *_three_ways(fn, sync, calls, _cuda_events(torch))))
    try:  # the same call through JAX, when it sees a GPU
        import jax
        import jax.numpy as jnp

        import jax_causal_conv as jcc

        if jax.default_backend() == "gpu":
            xj = jnp.asarray(x.float().cpu().numpy().transpose(0, 2, 1), jnp.bfloat16)
            wj, bj = (jnp.asarray(t.float().cpu().numpy(), jnp.bfloat16) for t in (w, b))
            f = jax.jit(lambda x: jcc.causal_conv1d(x, wj, bj, activation="silu", channels_last=True))
            last = [f(xj)]

            def call():
                last[0] = f(xj)

            rows.append(("jax_causal_conv (JAX)",
                         *_three_ways(call, lambda: last[0].block_until_ready(), calls, None)))
    except ImportError:
        pass
    return rows


def _cuda_events(torch):
    def timer(fn, n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / n
    return timer


def _three_ways(fn, sync, calls, device_timer):
    """(waited, back-to-back, host) microseconds per call: medians of calls
    each followed by sync(); device time per call over `calls` calls in a
    row (wall time when no device timer); host time of one call."""
    for _ in range(10):
        fn()
    sync()
    waited, host = [], []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        t1 = time.perf_counter_ns()
        sync()
        waited.append(time.perf_counter_ns() - t0)
        host.append(t1 - t0)
    if device_timer is not None:
        row = device_timer(fn, calls)
    else:
        t0 = time.perf_counter_ns()
        for _ in range(calls - 1):
            fn()
        sync()
        row = (time.perf_counter_ns() - t0) / calls / 1e3
    return statistics.median(waited) / 1e3, row, statistics.median(host) / 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--calls", type=int, default=2000, help="calls per round (default 2000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--large", metavar="B,L,D", help="time one large channel-last bf16 forward "
                   "instead (CUDA only), e.g. 1,8192,2048")
    p.add_argument("--dao", metavar="SRC", help="build Dao-AILab causal-conv1d from this source "
                   "tree first (benchmarks/dao_baseline.py), where it is not installed")
    args = p.parse_args(argv)

    import torch

    if args.dao:
        from .dao_baseline import load
        load(args.dao)

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_overhead: --device cuda, but torch sees no CUDA device")
    if args.large:
        # JAX's backend starts at its first array: let it share the GPU with torch
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if args.device != "cuda":
            raise SystemExit("torch_overhead: --large needs --device cuda")
        shape = tuple(int(v) for v in args.large.split(","))
        print(f"channel-last bfloat16 forward, (B, L, D) = {shape}, W=4, SiLU, "
              f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us per call")
        print(f"{'implementation':<26} {'waited':>9} {'back-to-back':>13} {'host':>8}")
        with torch.no_grad():
            for name, waited, row, host in _large(torch, shape, min(args.calls, 200)):
                print(f"{name:<26} {waited:9.1f} {row:13.1f} {host:8.1f}")
        return
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    if args.device == "cpu":  # intra-op worker threads of one case would steal cores from the next
        torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    cases = _cases(torch, args.device, dtype)
    rows = [(name, impl, *_time(torch, fn, sync, args.calls, args.rounds))
            for name, impls in cases for impl, fn in impls.items()]
    dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"host time per call, {args.dtype}, {dev}, torch {torch.__version__}, "
          f"{args.rounds} x {args.calls} calls")
    if args.markdown:
        print("\n| case | implementation | median us | p90 us | profiler CPU us |")
        print("|---|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.1f} |")
    else:
        for r in rows:
            print(f"{r[0]:<42} {r[1]:<26} median {r[2]:7.1f} us  p90 {r[3]:7.1f} us  "
                  f"profiler {r[4]:7.1f} us")


if __name__ == "__main__":
    main()
