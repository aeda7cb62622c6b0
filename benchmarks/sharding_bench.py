"""Sequence-parallel benchmark: forward + backward, L split over all local devices
vs. the same problem on one device.

    python -m benchmarks.sharding_bench [--output docs/benchmarks.md]  # (8, 4096, 32768) bf16, every local GPU
    python -c "from benchmarks.sharding_bench import bench_sequence_parallel as b; b(L=4096)"

Prints the time per fwd+bwd step on 1 device and on n devices, and the
throughput ratio (ideal: n; the halo exchange is W-1 columns per shard).
The sharded step is the plain public call under jit on sequence-split inputs
(the kernels partition themselves); it needs 2 or more local devices.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_causal_conv as jcc
from benchmarks.report import write_section
from benchmarks.timing import timeit


def _time(f, args, iters, calls=5):
    """Median seconds per step: bench.timeit, `calls` steps dispatched back to
    back per sample so host dispatch overlaps the device work."""
    return timeit(f, *args, reps=iters, warmup=2, calls=calls)


def bench_sequence_parallel(B=8, D=4096, L=32768, W=4, dtype=jnp.bfloat16, iters=20,
                            activation="silu", channels_last=False, devices=None):
    """fwd+bwd of causal_conv1d on x (B, D, L) (or (B, L, D) with channels_last):
    one device vs. L sharded over ``devices`` (default: all local devices).
    Returns a dict of the measurements; prints them too."""
    devices = list(jax.local_devices() if devices is None else devices)
    n = len(devices)
    if n < 2:
        raise SystemExit(f"sharding_bench needs 2 or more local devices, found {n}")
    shape = (B, L, D) if channels_last else (B, D, L)
    k = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(k[0], shape, dtype)
    g = jax.random.normal(k[1], shape, dtype)
    w = (jax.random.normal(k[2], (D, W), jnp.float32) / W ** 0.5).astype(dtype)
    b = jnp.zeros((D,), dtype)
    kw = dict(activation=activation, channels_last=channels_last)

    def step(conv):
        def f(x, w, b, g):
            y, vjp = jax.vjp(lambda x, w, b: conv(x, w, b), x, w, b)
            return (y, *vjp(g))  # y, dx, dw, db: the forward and the backward kernels
        return jax.jit(f)

    one = jax.device_put((x, w, b, g), devices[0])
    single = lambda x, w, b: jcc.causal_conv1d(x, w, b, **kw)  # noqa: E731
    t1 = _time(step(single), one, iters)
    f1 = _time(jax.jit(single), one[:3], iters)

    mesh = Mesh(np.array(devices), ("seq",))
    xs = P(None, "seq", None) if channels_last else P(None, None, "seq")
    sharded = (jax.device_put(x, NamedSharding(mesh, xs)),
               jax.device_put(w, NamedSharding(mesh, P())),
               jax.device_put(b, NamedSharding(mesh, P())),
               jax.device_put(g, NamedSharding(mesh, xs)))
    tn = _time(step(single), sharded, iters)   # the same call: it follows x's sharding
    fn = _time(jax.jit(single), sharded[:3], iters)
    # bytes moved by the kernels per step: fwd reads x, writes y; bwd reads x, dy, writes dx
    nbytes = 5 * x.size * jnp.dtype(dtype).itemsize
    res = dict(devices=n, platform=devices[0].platform, shape=shape, dtype=jnp.dtype(dtype).name,
               t_1dev_ms=t1 * 1e3, t_ndev_ms=tn * 1e3, ratio=t1 / tn,
               fwd_1dev_ms=f1 * 1e3, fwd_ndev_ms=fn * 1e3, fwd_ratio=f1 / fn,
               gbps_1dev=nbytes / t1 / 1e9, gbps_ndev=nbytes / tn / 1e9)
    print(f"causal_conv1d fwd+bwd {shape} {res['dtype']} W={W} on {res['platform']}:")
    print(f"  1 device : {t1 * 1e3:9.3f} ms/step  ({res['gbps_1dev']:8.1f} GB/s kernel traffic)")
    print(f"  {n} devices: {tn * 1e3:9.3f} ms/step  ({res['gbps_ndev']:8.1f} GB/s aggregate)")
    print(f"  throughput ratio {res['ratio']:.2f}x (ideal {n}x); forward alone "
          f"{f1 * 1e3:.3f} -> {fn * 1e3:.3f} ms ({f1 / fn:.2f}x)")
    return res


def write_markdown(res, path):
    """Puts the result between the sharding markers of ``path`` (keeping the rest)."""
    import datetime
    dev = jax.local_devices()[0]
    today = datetime.date.today().isoformat()
    body = "\n".join([
        f"### Sequence-parallel fwd+bwd: {res['devices']} x {getattr(dev, 'device_kind', dev.platform)}, "
        f"{today}, jax {jax.__version__}",
        "",
        "One step = forward and backward (y, dx, dweight, dbias) of `causal_conv1d`, "
        f"{res['shape']} {res['dtype']}, W=4, SiLU; `jcc.causal_conv1d` under `jit` on x "
        "sequence-split with a NamedSharding (halo of W-1 columns exchanged) "
        "against the same step on one device, in one run.",
        "",
        "| devices | ms per step | kernel traffic GB/s | throughput vs 1 device |",
        "|---:|---:|---:|---:|",
        f"| 1 | {res['t_1dev_ms']:.3f} | {res['gbps_1dev']:.0f} | 1.00x |",
        f"| {res['devices']} | {res['t_ndev_ms']:.3f} | {res['gbps_ndev']:.0f} | {res['ratio']:.2f}x |",
        "",
        f"Forward alone: {res['fwd_1dev_ms']:.3f} ms on 1 device, {res['fwd_ndev_ms']:.3f} ms on "
        f"{res['devices']} ({res['fwd_ratio']:.2f}x).",
    ])
    write_section(path, "sharding-bench", body + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.sharding_bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("file", nargs="?", help="the older form of --output")
    p.add_argument("--output", metavar="FILE",
                   help="write the table into FILE between the sharding markers")
    p.add_argument("--length", type=int, default=32768, help="sequence length L (default 32768)")
    args = p.parse_args(argv)
    result = bench_sequence_parallel(L=args.length)
    path = args.output or args.file
    if path:
        write_markdown(result, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
