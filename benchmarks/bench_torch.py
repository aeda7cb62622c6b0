"""PyTorch: our kernels through ``jax_causal_conv.torch`` (DLPack) against
PyTorch's own depthwise convolution (``F.conv1d(groups=dim)``), forward and
training step (``autograd.grad``; eager, so the forward runs too), bias and
SiLU on, W=4.

    python -m benchmarks.bench_torch --platform gpu --output docs/benchmarks.md
    rows = torch_benchmarks("cuda")   # or "cpu"; [] when torch is missing

Rows use report.add_row's keys: shape, impl, fwd_ms, step_ms, copy_ms (a
same-size ``torch.neg`` pass) and frac (copy time / forward time). Each call
is waited for (``torch.cuda.synchronize``), so host overhead counts.
"""

from __future__ import annotations

import statistics
import sys
import time

from .report import add_row, emit, run_meta, section_main, speed_section


def _shapes(device):
    import torch

    if device == "cuda":
        return [((8, 4096, 4096), torch.bfloat16, False), ((8, 4096, 4096), torch.bfloat16, True),
                ((8, 4096, 4096), torch.float32, False), ((32, 512, 1024), torch.bfloat16, False)]
    return [((4, 512, 2048), torch.float32, False), ((4, 512, 2048), torch.float32, True),
            ((8, 128, 512), torch.float32, False)]


def _timeit(f, device, reps, warmup=3):
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        f()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def torch_benchmarks(device="cpu", W=4, shapes=None, reps=None, log=print):
    """Benchmark rows for ``device`` ("cpu" or "cuda"); [] when torch (or
    CUDA, for "cuda") is unavailable."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        log("torch benchmarks skipped: torch is not installed")
        return []
    if device == "cuda" and not torch.cuda.is_available():
        log("torch benchmarks skipped: no CUDA device")
        return []
    import jax_causal_conv.torch as jt

    def ours(x, w, b):
        return jt.causal_conv1d_fn(x, w, b, activation="silu")

    def conv1d(x, w, b):
        y = F.conv1d(x, w[:, None], b, padding=w.shape[1] - 1, groups=w.shape[0])
        return F.silu(y[..., :x.shape[-1]])

    impls = {"torch adapter (ours)": ours, "F.conv1d groups=D": conv1d}
    reps = reps or (30 if device == "cuda" else 5)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for (B, D, L), dt, cl in (shapes or _shapes(device)):
        def rnd(*shape):
            return torch.randn(*shape, generator=gen).to(device, dt)

        def act(*shape):  # (B, D, L), Dao's channel-last (a transposed (B, L, D)) if cl
            return rnd(B, L, D).transpose(1, 2) if cl else rnd(B, D, L)

        x, g = act(), act()  # the cotangent in x's layout, as a model's would be
        w, b = rnd(D, W) / 2, rnd(D)
        t_copy = _timeit(lambda: torch.neg(x), device, reps)
        name = f"({B},{D},{L}) {str(dt).replace('torch.', '')}{' CL' if cl else ''} torch"
        for impl, fn in impls.items():
            def measure(fn=fn):
                with torch.no_grad():
                    t_f = _timeit(lambda: fn(x, w, b), device, reps)
                xs, ws, bs = (t.detach().requires_grad_() for t in (x, w, b))

                def step():
                    y = fn(xs, ws, bs)
                    return y, torch.autograd.grad(y, (xs, ws, bs), g)

                return t_f, _timeit(step, device, reps)

            add_row(rows, log, name, impl, measure, t_copy)
    return rows


def markdown(meta, rows):
    return speed_section(
        meta, "PyTorch, W=4",
        "Our kernels through `jax_causal_conv.torch` (DLPack) against `F.conv1d(groups=D)` + "
        "SiLU; median wall time per call, each call waited for. 'train step' = forward and "
        "`autograd.grad` with respect to x, weight and bias. 'copy' = a same-size `torch.neg`. "
        "CL = Dao's channel-last (a transposed (B, L, D) tensor).", rows, "torch adapter (ours)")


def run_torch(platform, output=None, log=None):
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    rows = torch_benchmarks("cuda" if platform == "gpu" else "cpu", log=log)
    if not rows:
        return ""
    text = markdown(run_meta(platform), rows)
    emit(text, output, f"{platform}-torch")
    return text


def main(argv=None):
    return section_main("bench_torch", __doc__, run_torch, argv)


if __name__ == "__main__":
    sys.exit(main())
