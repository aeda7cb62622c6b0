"""Probe: Dao-AILab causal-conv1d's kernels against ours on the same torch
tensors (GPU): forward and forward + backward at W = 4 (and 3, 2 where asked),
channels-first, channel-last and channel-last with seq_idx (8 segments a
row, a padded tail), bf16 (8, 4096, 4096), bias + SiLU. Ours runs through
jax_causal_conv.torch (the DLPack adapter; the same CUDA kernels as JAX's
custom calls). Device time per call from CUDA events around a loop of calls
(kernels of ~100 us and more: the host keeps ahead), beside an in-place
copy pass over x (`x.mul_(-1)`, read and write) as the yardstick.

    python -m benchmarks.probes.dao_kernels_probe --dao .baselines/causal-conv1d [--widths 2,3,4]
"""
from __future__ import annotations

import argparse
import sys


def _cuda_time(torch, fn, iters=40, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / iters)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dao", default=".baselines/causal-conv1d", help="its source tree")
    p.add_argument("--shape", default="8,4096,4096", help="B,D,L")
    p.add_argument("--widths", default="4")
    args = p.parse_args(argv)
    import torch

    from benchmarks.dao_baseline import load
    load(args.dao)
    from causal_conv1d import causal_conv1d_fn as dao_fn

    import jax_causal_conv.torch as jt

    B, D, L = (int(v) for v in args.shape.split(","))
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    x_cf = torch.randn(B, D, L, device=dev, dtype=dt, generator=g)
    x_cl = torch.randn(B, L, D, device=dev, dtype=dt, generator=g).transpose(1, 2)
    dy = torch.randn(B, D, L, device=dev, dtype=dt, generator=g)
    n = L * 95 // 100  # 8 segments over the first 95%, padding (-1) after
    ids = torch.full((B, L), -1, dtype=torch.int32, device=dev)
    ids[:, :n] = (torch.arange(n, device=dev) * 8 // n).to(torch.int32)
    copy = _cuda_time(torch, lambda: x_cf.mul_(-1))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, (B, D, L) = ({B}, {D}, {L}) bf16, "
          f"bias + SiLU; device us per call (CUDA events); in-place copy pass over x: {copy:.1f} us")
    print(f"{'case':<28} {'W':>2} {'pass':<8} {'Dao':>9} {'ours':>9} {'Dao/ours':>9}")
    for W in (int(v) for v in args.widths.split(",")):
        w = torch.randn(D, W, device=dev, dtype=dt, generator=g) / W
        b = torch.randn(D, device=dev, dtype=dt, generator=g)
        for name, x, sidx in (("channels-first", x_cf, None), ("channel-last", x_cl, None),
                              ("channel-last seq_idx", x_cl, ids)):
            dyl = dy if x is x_cf else dy.transpose(1, 2).contiguous().transpose(1, 2)
            xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, w, b))
            if x is x_cl:
                xg = x.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()

            def fwd(fn):
                return lambda: fn(x, w, b, seq_idx=sidx, activation="silu")

            def step(fn):
                def run():
                    for t in (xg, wg, bg):
                        t.grad = None
                    y = fn(xg, wg, bg, seq_idx=sidx, activation="silu")
                    y.backward(dyl)
                return run

            with torch.no_grad():
                yd, yo = fwd(dao_fn)(), fwd(jt.causal_conv1d_fn)()
            err = (yd.float() - yo.float()).abs().max().item()
            for what, make in (("fwd", fwd), ("fwd+bwd", step)):
                if what == "fwd":
                    with torch.no_grad():
                        td, to = _cuda_time(torch, make(dao_fn)), _cuda_time(torch, make(jt.causal_conv1d_fn))
                else:
                    td, to = _cuda_time(torch, make(dao_fn)), _cuda_time(torch, make(jt.causal_conv1d_fn))
                print(f"{name:<28} {W:>2} {what:<8} {td:9.1f} {to:9.1f} {td / to:9.2f}"
                      + (f"   (max |y_Dao - y_ours| {err:.3g})" if what == "fwd" else ""))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
