"""W=4 against every JAX baseline a user might otherwise write: ours, jitted
``lax.conv_general_dilated`` (depthwise), the jitted XLA shifted sum
(``jax_causal_conv.reference``) and, channels-last, Flax ``nn.Conv``.

    python -m benchmarks.baselines --platform gpu --output docs/benchmarks.md

Per shape: the forward and a training step that keeps the forward
(``jax.vjp``: y returned beside the gradients with respect to x, weight and
bias), wall time per call; a same-size ``-x`` pass in the same run is the
bandwidth yardstick. bench_torch.py times PyTorch the same way.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_causal_conv as jcc
from jax_causal_conv.cli.progress import Progress
from jax_causal_conv.cli.quick_bench import train_step

from .report import add_row, emit, run_meta, section_main, speed_section
from .timing import batched, timeit

W = 4


def shapes(platform):
    """[((B, D, L), dtype, channels_last)]"""
    if platform == "gpu":
        return [((8, 4096, 4096), jnp.bfloat16, False), ((4, 2048, 16384), jnp.bfloat16, False),
                ((8, 4096, 4096), jnp.bfloat16, True), ((8, 4096, 4096), jnp.float32, False),
                ((32, 512, 1024), jnp.bfloat16, False)]
    return [((8, 512, 4096), jnp.float32, False), ((4, 512, 2048), jnp.float32, True),
            ((4, 512, 2048), jnp.bfloat16, False), ((8, 128, 512), jnp.float32, False)]


def lax_conv(x, w, b, cl):
    Wd = w.shape[-1]
    if cl:
        y = lax.conv_general_dilated(x, w.T[:, None, :], (1,), [(Wd - 1, 0)],
                                     dimension_numbers=("NWC", "WIO", "NWC"),
                                     feature_group_count=x.shape[-1])
        return jax.nn.silu(y + b)
    y = lax.conv_general_dilated(x, w[:, None, :], (1,), [(Wd - 1, 0)],
                                 dimension_numbers=("NCH", "OIH", "NCH"),
                                 feature_group_count=x.shape[1])
    return jax.nn.silu(y + b[:, None])


def impls(cl):
    """{name: f(x, w, b)}, every one causal depthwise conv + bias + SiLU."""
    out = {
        "ours": lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", channels_last=cl,
                                                  backend="ffi"),
        "lax.conv": lambda x, w, b: lax_conv(x, w, b, cl),
        "XLA shifted sum": lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu",
                                                             channels_last=cl, backend="xla"),
    }
    if cl:
        try:
            from flax import linen as nn

            def flax_conv(x, w, b):
                D, Wd = w.shape
                m = nn.Conv(features=D, kernel_size=(Wd,), feature_group_count=D, padding="CAUSAL",
                            dtype=x.dtype, param_dtype=w.dtype)
                return jax.nn.silu(m.apply({"params": {"kernel": w.T[:, None, :], "bias": b}}, x))
            out["flax nn.Conv"] = flax_conv
        except ImportError:
            pass
    return out


def bench_baselines(platform, log=print):
    rows = []
    rng = np.random.default_rng(0)
    gpu = platform == "gpu"
    for (B, D, L), dt, cl in shapes(platform):
        shape = (B, L, D) if cl else (B, D, L)
        x = jnp.asarray(rng.standard_normal(shape), dt)
        w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
        b = jnp.asarray(rng.standard_normal((D,)), dt)
        g = jnp.asarray(rng.standard_normal(shape), dt)
        # Shapes under 64 MiB on the GPU: one program of n independent calls
        # on n inputs (batched), so the cache does not serve them.
        n = 16 if (gpu and x.size * x.dtype.itemsize < (64 << 20)) else 1
        span = dict(reps=20 if gpu else 5, calls=4 if gpu else 1,
                    min_sample_s=0.02 if gpu else 0.0, max_s=2.0)
        xin, wrap = (tuple(x * (1 + i / n) for i in range(n)), batched) if n > 1 else (x, jax.jit)
        t_copy = timeit(wrap(lambda x, *_: -x), xin, inner=n, **span)
        name = f"({B},{D},{L}) {jnp.dtype(dt).name}{' CL' if cl else ''}"
        for impl, fn in impls(cl).items():
            add_row(rows, log, name, impl, lambda fn=fn: (
                timeit(wrap(fn), xin, w, b, inner=n, **span),
                timeit(jax.jit(train_step(fn)), x, w, b, g, **span)), t_copy)
    return rows


def markdown(meta, rows):
    return speed_section(
        meta, "W=4 against the JAX baselines",
        "Median wall time per call; bias and SiLU on. 'train step' = the forward and the "
        "gradients with respect to x, weight and bias, y returned beside them (`jax.vjp`). "
        "'copy' is a same-size `-x` pass in the same run (each byte of x read and written "
        "once); 'of copy bw' = copy time / forward time. 'ours faster' = that row's time / "
        "ours, same shape (fwd / train step). Shapes under 64 MiB on a GPU: 16 independent "
        "calls on 16 inputs in one program (forward and copy), time per call.", rows, "ours")


def run_baselines(platform, output=None):
    with jax.default_device(jax.devices(platform)[0]), \
            Progress(0, f"baselines ({platform})") as p:
        meta = run_meta(platform)
        rows = bench_baselines(platform, log=p.log)
    text = markdown(meta, rows)
    emit(text, output, f"{platform}-baselines")
    return text


def main(argv=None):
    return section_main("baselines", __doc__, run_baselines, argv)


if __name__ == "__main__":
    sys.exit(main())
