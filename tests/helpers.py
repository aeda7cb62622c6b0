"""Shared test helpers: random inputs, per-dtype tolerances, and running a
test on the CPU device."""

import contextlib
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

# float64 is CPU-only (SPEC), and some tests test the CPU kernels by name:
# they run on the CPU device even where the default device is a GPU. Mark such
# a test (or a parametrization) `on_cpu` (conftest.py applies it), or wrap one
# that draws its dtype (hypothesis) in float64_on_cpu. Arrays made and programs
# lowered under on_cpu() are the CPU's; jax.export's are not (it takes the
# default backend): name its platforms.
def on_cpu(when=True):
    return jax.default_device(jax.devices("cpu")[0]) if when else contextlib.nullcontext()


def float64_on_cpu(test):
    """test(..., dtype=...), under on_cpu() where the dtype is float64."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        with on_cpu(kwargs["dtype"] == jnp.float64):
            return test(*args, **kwargs)
    return run


def package_env(**extra):
    """The environment of a fresh Python process that imports the package
    under test (installed, or the source tree in development), plus extra."""
    import jax_causal_conv
    pkg_parent = os.path.dirname(os.path.dirname(jax_causal_conv.__file__))
    return dict(os.environ, PYTHONPATH=os.pathsep.join([pkg_parent, os.environ.get("PYTHONPATH", "")]),
                **extra)


def forward_v1(x, w, b, seq_idx, init):
    """The legacy forward target jax_causal_conv_fwd_v1 (no workspace
    result; kept for exported programs), called directly: channels-first x,
    weight (D, W), bias (D,), seq_idx and initial states, SiLU."""
    ph = jnp.zeros((0,), x.dtype)
    call = jax.ffi.ffi_call("jax_causal_conv_fwd_v1", (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                                        jax.ShapeDtypeStruct((0,), x.dtype)))
    y, _ = jax.jit(lambda *a: call(
        *a, activation=np.int64(1), mode=np.int64(1), channels_last=np.bool_(False),
        states_channels_last=np.bool_(False), has_bias=np.bool_(True), has_residual=np.bool_(False),
        has_initial_states=np.bool_(True), has_final_states=np.bool_(False)))(
        x, w[None], b[None], ph, seq_idx, jnp.zeros((0,), jnp.int32), init)
    return y


DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16,
          "float64": jnp.float64}

# (rtol, atol) for results rounded once to the dtype from a float32 accumulator.
TOL = {jnp.float64: (1e-10, 1e-10), jnp.float32: (2e-5, 2e-5), jnp.float16: (4e-3, 4e-3),
       jnp.bfloat16: (2e-2, 2e-2)}


def tol(dtype):
    return TOL[jnp.dtype(dtype).type] if jnp.dtype(dtype).type in TOL else TOL[dtype]


def rand(rng, shape, dtype=jnp.float32, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype)


def seq_idx(rng, B, L, n_max=4):
    return jnp.asarray(np.sort(rng.integers(0, n_max, (B, L)), axis=1), jnp.int32)


def close(a, b, dtype, scale=1.0):
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=rtol, atol=atol * scale)


def to_np(a):
    return None if a is None else np.asarray(a, np.float64)


def custom_calls(hlo_text, name="jax_causal_conv"):
    return hlo_text.count(f"custom_call @{name}") + hlo_text.count(f'custom_call_target="{name}')


def swap_layout(a, cl):
    """With cl, a (B, L, D) array as (B, D, L) or back (the oracle works
    channels-first), as float64 numpy; without, a as float64 numpy. None stays None."""
    if a is None:
        return None
    a = np.asarray(a, np.float64)
    return np.swapaxes(a, 1, 2) if cl else a
