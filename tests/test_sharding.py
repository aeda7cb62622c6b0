"""Sharded entry points (jax_causal_conv.sharding) on 8 virtual CPU devices.

The device count is an XLA flag read when jax initialises its backends, which
the other test files have already done in this process: the checks run in a
fresh interpreter (tests/_sharding_child.py) that reports one line per case.
Each case compares forward and gradients with the unsharded call and asserts
the collectives in the compiled HLO (none for batch/channel sharding; the W-1
halo collective-permute and its reverse for sequence sharding; all-reduces
only for d(weight), d(bias), d(initial_states) and returned final states)."""

import os
import subprocess
import sys

import pytest

import jax_causal_conv as jcc

HERE = os.path.dirname(__file__)


def run_child(**env_extra):
    pkg_parent = os.path.dirname(os.path.dirname(jcc.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pkg_parent, os.environ.get("PYTHONPATH", "")]),
               **env_extra)
    r = subprocess.run([sys.executable, os.path.join(HERE, "_sharding_child.py")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert "DONE" in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])
    return [line.split(" ", 2)[1:] for line in r.stdout.splitlines() if line.startswith("CASE ")]


@pytest.fixture(scope="module")
def report():
    return run_child(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")


def _local_gpus():
    """GPUs visible to a fresh process (this one may be pinned to the CPU)."""
    code = "import jax\ntry:\n print(len(jax.devices('gpu')))\nexcept RuntimeError:\n print(0)"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    return int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else 0


@pytest.mark.gpu
def test_sharding_cases_on_real_gpus():
    """The same cases on the local GPUs (NCCL collectives), those whose mesh fits."""
    n = _local_gpus()
    if n < 2:
        pytest.skip("needs 2 or more GPUs")
    rep = run_child(JCC_SHARDING_PLATFORM="gpu", NCCL_NVLS_ENABLE="0", JAX_PLATFORMS="cuda")
    failed = [f"{name}: {status}" for name, status in rep if not status.startswith(("OK", "SKIP"))]
    assert not failed, "\n".join(failed)
    ran = {name.split("_", 1)[1] for name, status in rep if status == "OK"}
    for want in ["batch2", "seq2", "channel2_cl", "explicit_mesh_from_make_mesh"]:
        assert want in ran, (want, sorted(ran))


def test_every_sharding_case_matches_unsharded_with_expected_collectives(report):
    failed = [f"{name}: {status}" for name, status in report if status != "OK"]
    assert not failed, "\n".join(failed)
    names = {name.split("_", 1)[1] for name, _ in report}
    # the combinations the issue asks for are all there
    for want in ["batch2", "batch4", "batch8", "channel2_cl", "channel8_cl", "seq2", "seq4",
                 "seq8", "batch2_x_seq4", "channel2_x_seq4_cl", "b2_c2_s2_seqidx",
                 "seq8_seqidx_cl_residual", "update_batch_and_channel_sharded",
                 "varlen_channel_sharded", "errors", "docs_example_runs"]:
        assert want in names, want
