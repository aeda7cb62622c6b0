"""Probe: the XLA twin's backward (autodiff of reference.causal_conv1d, what
TPU / ROCm, float64 and backend="xla" run) against a formulation written
out by hand, for their temporary memory (XLA's memory analysis of the
compiled program), their time (median wall time of alternating calls; the
backward alone and a training step: y and the gradients from one program)
and their agreement (float64).

The autodiff of the shifted sum keeps about one product a tap alive at
once (W copies of x; docs/performance-log.md, 2026-11-28). The written-out
backward, for dense rows and seq_idx with bias, SiLU and initial / final
states (not varlen, not the residual):
    pre  = bias + sum_k w[k] xm_k,   xm_k = x at t - H + k where its id is t's, else 0
    g    = dy silu'(pre)             (0 on padding outputs)
    dxp  = sum_k shift_k(w[k] g_k),  g_k = g where tap k counts, else 0
           (x's positions and the history's as two sums)
    dw_k = sum over b, t of g xm_k   (one tap at a time: lax.map),  db = sum of g
and the final states' cotangent through the vjp of the final-state slice
alone. Measured (docs/performance-log.md, 2026-11-28): on the 2-core CPU
the written form holds 12-16 MiB against 16-516 MiB and runs 1.6-7.2x
faster; on an H200 at (8, 4096, 4096) bfloat16 the autodiff is the better
one (its temporaries one float32 copy of x at W 1, 4, 16, 64 dense and
1, 4, 16 seq_idx; the written form's two, and 1.2-3.7x its time at W >= 4, level
at W 1), so the twin keeps the autodiff. Run on any platform:
    python3 -m benchmarks.probes.twin_backward_memory [--shape B,D,L] [--widths 4,16,64]
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_causal_conv import reference


def written_backward(x, w, b, seq_idx, init, dy, dfin, silu=True):
    """(dx, dw, db, dinit) of reference.causal_conv1d(x, w, b, activation,
    seq_idx, initial_states=init, return_final_states=dfin is not None) at
    cotangents dy (and dfin), channels-first, written out tap by tap."""
    B, D, L = x.shape
    W = w.shape[-1]
    H = W - 1
    f32 = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    has_init = init is not None
    hist = init.astype(f32) if has_init else jnp.zeros((B, D, H), f32)
    xp = jnp.concatenate([hist, x.astype(f32)], axis=-1)
    masks = None if seq_idx is None else reference._seq_masks(seq_idx, L, W, has_init)

    def xm(k):
        v = xp[..., k:k + L]
        return v if masks is None else jnp.where(masks[k], v, 0)

    wf = w.astype(f32)
    pre = sum(wf[:, k, None] * xm(k) for k in range(W)) + (0 if b is None else b.astype(f32)[:, None])
    g = dy.astype(f32)
    if silu:
        s = jax.nn.sigmoid(pre)
        g = g * s * (1 + pre * (1 - s))
    if seq_idx is not None:
        g = jnp.where((seq_idx >= 0)[:, None, :], g, 0)
    # dxp[s] = sum_k w[k] g_k[s - k] (t = s - k in 0 .. L - 1), as two
    # shifted sums: x's positions s = H + i, and the history's s < H, which
    # read only g's first H steps (XLA keeps every tap's term as a buffer
    # when two slices of one sum of padded terms are taken)
    def g_tap(k, n):  # g_k of the first n steps
        gk = g[..., :n]
        return gk if masks is None else jnp.where(masks[k][..., :n], gk, 0)
    dx = sum(wf[:, k, None] * jnp.pad(g_tap(k, L), ((0, 0), (0, 0), (0, H)))[..., H - k:H - k + L]
             for k in range(W))
    dinit = None
    if has_init:
        n = min(H, L)
        dinit = sum(wf[:, k, None] * jnp.pad(g_tap(k, n), ((0, 0), (0, 0), (H, H - n)))[..., H - k:2 * H - k]
                    for k in range(W))
    # dw one tap at a time (lax.map: W separate reductions fused into one
    # program keep every tap's product alive at once)
    stacked = None if masks is None else jnp.stack(masks)

    def dw_tap(k):
        v = lax.dynamic_slice_in_dim(xp, k, L, axis=2)
        if stacked is not None:
            v = jnp.where(stacked[k], v, 0)
        return jnp.sum(g * v, axis=(0, 2))
    dw = lax.map(dw_tap, jnp.arange(W)).T
    db = jnp.sum(g, axis=(0, 2))
    if dfin is not None:  # the final states read xp: their cotangent adds there
        def final(xp):
            if seq_idx is None:
                return xp[..., L:]
            return reference._seq_final_states(xp, seq_idx, H, has_init)
        dfp = jax.vjp(final, xp)[1](dfin.astype(f32))[0]
        dx = dx + dfp[..., H:]
        dinit = None if dinit is None else dinit + dfp[..., :H]
    return (dx.astype(x.dtype), dw.astype(w.dtype), None if b is None else db.astype(b.dtype),
            None if dinit is None else dinit.astype(x.dtype))


def autodiff_backward(x, w, b, seq_idx, init, dy, dfin, silu=True):
    """The same from jax.vjp of the reference (what xla_twins.backward does)."""
    want_final = dfin is not None

    def f(x, w, b, init):
        return reference.causal_conv1d(x, w, b, activation="silu" if silu else None, seq_idx=seq_idx,
                                       initial_states=init, return_final_states=want_final)
    _, vjp = jax.vjp(f, x, w, b, init)
    return vjp((dy, dfin) if want_final else dy)


def step(backward):
    """A training step on backward: y and the gradients from one program."""
    def run(x, w, b, seq_idx, init, dy, dfin):
        y = reference.causal_conv1d(x, w, b, activation="silu", seq_idx=seq_idx, initial_states=init,
                                    return_final_states=dfin is not None)
        return y, backward(x, w, b, seq_idx, init, dy, dfin)
    return run


def inputs(B, D, L, W, dtype, mode, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((B, D, L)), dtype)
    w = jnp.asarray(rng.standard_normal((D, W)) / np.sqrt(W), dtype)
    b = jnp.asarray(rng.standard_normal(D), dtype)
    dy = jnp.asarray(rng.standard_normal((B, D, L)), dtype)
    seq = init = dfin = None
    if mode in ("seq_idx", "seq_idx_states"):
        cuts = np.sort(rng.choice(np.arange(1, L), 6, replace=False))
        ids = np.searchsorted(cuts, np.arange(L), side="right").astype(np.int32)
        ids[L // 3: L // 3 + 5] = -1
        ids[-7:] = -1
        seq = jnp.asarray(np.broadcast_to(ids, (B, L)).copy())
    if mode in ("states", "seq_idx_states"):
        init = jnp.asarray(rng.standard_normal((B, D, W - 1)), dtype)
        dfin = jnp.asarray(rng.standard_normal((B, D, W - 1)), dtype)
    return x, w, b, seq, init, dy, dfin


def compiled(fn, args):
    return jax.jit(fn).lower(*args).compile()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="1,256,4096", help="B,D,L (default 1,256,4096)")
    p.add_argument("--widths", default="4,16,64")
    p.add_argument("--modes", default="dense,seq_idx,states,seq_idx_states")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reps", type=int, default=20, help="timed calls of each (alternating)")
    args = p.parse_args(argv)
    B, D, L = (int(v) for v in args.shape.split(","))
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, (B, D, L) = ({B}, {D}, {L}), "
          f"{args.dtype}, bias + SiLU; temporaries from XLA's memory analysis, "
          f"x = {B * D * L * jnp.dtype(args.dtype).itemsize / 2 ** 20:.1f} MiB")
    print("| mode | W | autodiff temp MiB | written temp MiB | autodiff bwd ms | written bwd ms "
          "| autodiff step ms | written step ms | max rel diff (float64) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    fns = {"auto": autodiff_backward, "written": written_backward,
           "auto step": step(autodiff_backward), "written step": step(written_backward)}
    for mode in args.modes.split(","):
        for W in (int(v) for v in args.widths.split(",")):
            a = inputs(B, D, L, W, jnp.dtype(args.dtype), mode)
            progs = {k: compiled(f, a) for k, f in fns.items()}
            temp = {k: c.memory_analysis().temp_size_in_bytes / 2 ** 20 for k, c in progs.items()}
            times = {k: [] for k in progs}
            for _ in range(args.reps):
                for k, c in progs.items():
                    t0 = time.perf_counter()
                    jax.block_until_ready(c(*a))
                    times[k].append(time.perf_counter() - t0)
            ms = {k: np.median(v) * 1e3 for k, v in times.items()}
            with jax.enable_x64(True):
                a64 = inputs(4, 8, 300, W, jnp.float64, mode, seed=1)
                got, want = written_backward(*a64), autodiff_backward(*a64)
                diff = max(float(jnp.max(jnp.abs(g - e)) / max(1.0, float(jnp.max(jnp.abs(e)))))
                           for g, e in zip(got, want) if e is not None and e.size)
            print(f"| {mode} | {W} | {temp['auto']:.1f} | {temp['written']:.1f} | {ms['auto']:.2f} | "
                  f"{ms['written']:.2f} | {ms['auto step']:.2f} | {ms['written step']:.2f} | {diff:.1e} |",
                  flush=True)


if __name__ == "__main__":
    main()
