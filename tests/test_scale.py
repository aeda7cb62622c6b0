"""Tensors past 2^31 elements (64-bit indexing). On a GPU this always runs; on
CPU it needs ~10 GB and a minute, so it runs on demand: JCC_RUN_HUGE=1."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_causal_conv as jcc

B, D, L = 2, 4096, 2**18 + 7  # 2,147,540,992 elements > 2^31
W = 4
WEIGHTS = np.array([0.25, -0.5, 0.75, 1.0], np.float32)


def _has_gpu():
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


pytestmark = pytest.mark.skipif(not (_has_gpu() or os.environ.get("JCC_RUN_HUGE")),
                                reason="needs a GPU or JCC_RUN_HUGE=1 (about 10 GB of memory)")


def _value(b, d, t):
    """x[b, d, t] as a cheap exact formula: multiples of 1/8 in [-1, 1]."""
    return (((t * 7 + d * 13 + b * 5) % 17) - 8) / 8.0


def _make(channels_last):
    shape = (B, L, D) if channels_last else (B, D, L)
    t = lax.broadcasted_iota(jnp.int32, shape, 1 if channels_last else 2)
    d = lax.broadcasted_iota(jnp.int32, shape, 2 if channels_last else 1)
    b = lax.broadcasted_iota(jnp.int32, shape, 0)
    return ((((t * 7 + d * 13 + b * 5) % 17) - 8).astype(jnp.float32) / 8).astype(jnp.bfloat16)


@pytest.mark.parametrize("channels_last", [False, True])
def test_tensor_past_2_31_elements_is_correct_at_sampled_positions(channels_last):
    device = jax.devices("gpu")[0] if _has_gpu() else jax.devices("cpu")[0]
    w = jax.device_put(jnp.tile(jnp.asarray(WEIGHTS)[None], (D, 1)), device)
    # x is made inside the jitted function, on w's device: no 4 GB host transfer
    f = jax.jit(lambda w: jcc.causal_conv1d(_make(channels_last), w, backend="ffi",
                                            channels_last=channels_last))
    y = f(w)
    assert y.size > 2**31
    rng = np.random.default_rng(0)
    pos = [(B - 1, D - 1, L - 1), (B - 1, D - 1, 0), (0, 0, 0), (1, 2048, L // 2)]
    pos += [tuple(int(v) for v in p) for p in zip(rng.integers(0, B, 60), rng.integers(0, D, 60),
                                                 rng.integers(0, L, 60))]
    idx = tuple(np.array(c) for c in zip(*pos))
    got = np.asarray(y[(idx[0], idx[2], idx[1]) if channels_last else idx].astype(jnp.float32))
    want = []
    for b, d, t in pos:
        acc = 0.0
        for k in range(W):
            src = t - (W - 1) + k
            if src >= 0:
                acc += WEIGHTS[k] * _value(b, d, src)
        want.append(acc)
    np.testing.assert_array_equal(got, np.asarray(want, np.float32))  # exact in bfloat16
