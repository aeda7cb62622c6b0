"""The command-line main job: demo training (in-process, few steps), cached
generation == full recomputation, `info` in a subprocess, `bench` plumbing."""

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

import jax_causal_conv as jcc  # noqa: E402
from jax_causal_conv.__main__ import main  # noqa: E402
from jax_causal_conv.cli import bench_cmd, demo  # noqa: E402



@pytest.fixture(scope="module")
def trained():
    return demo.train_lm(steps=30, seed=0, layers=2, width=4, dim=64, batch=8, seq_len=64,
                         platform="cpu")


def test_packaged_text_is_there():
    text = demo.load_text()
    assert len(text) > 3000
    text.decode("utf-8")


def test_demo_loss_falls(trained):
    losses = np.asarray(trained.losses)
    assert losses.shape == (30,) and np.all(np.isfinite(losses))
    assert abs(losses[0] - np.log(256)) < 0.5           # starts near uniform over bytes
    assert losses[-5:].mean() < losses[:5].mean() - 1.0  # and clearly falls


def test_demo_generate_cached_equals_full(trained):
    prompt = b"On the northern "
    toks, cached = demo.generate(trained, prompt, 20, temperature=0.7, seed=1)
    assert toks.shape == (1, len(prompt) + 20)
    assert bytes(np.asarray(toks[0, :len(prompt)], np.uint8)) == prompt
    assert cached.shape == (1, len(prompt) + 20, 256)
    diff, scale = demo.check_cache(trained, toks, cached)
    assert diff <= 1e-4 * max(1.0, scale), diff
    # the same, computed here: every cached step against one full forward pass
    with jax.default_device(trained.device), jax.default_matmul_precision("highest"):
        full = trained.model.apply({"params": trained.params}, toks[:, :-1])
    np.testing.assert_allclose(cached[:, :-1], full, rtol=1e-4, atol=1e-4)


def test_info_subprocess(tmp_path):
    # the package under test (installed, or the source tree in development), run
    # from elsewhere so the source tree does not shadow an installed build
    pkg_parent = os.path.dirname(os.path.dirname(jcc.__file__))
    env = dict(os.environ, PYTHONPATH=pkg_parent + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-m", "jax_causal_conv", "info"], capture_output=True,
                       text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert jax.__version__ in r.stdout
    assert "FFI targets" in r.stdout
    for t in jcc.TARGETS:
        assert t in r.stdout


def test_bench_command(tmp_path, monkeypatch, capsys):
    import importlib
    try:
        importlib.import_module("benchmarks.bench")
    except ModuleNotFoundError:
        assert main(["bench", "--out", str(tmp_path / "b.md")]) == 2
        assert "benchmarks.bench" in capsys.readouterr().err
    else:
        try:
            import matplotlib  # noqa: F401
        except ImportError:  # refused before any benchmark runs
            assert main(["bench", "--out", str(tmp_path / "b.md"), "--plot",
                         str(tmp_path / "p.png")]) == 2
            assert "needs matplotlib" in capsys.readouterr().err
            assert not (tmp_path / "b.md").exists()
    got = bench_cmd.series([{"impl": "ffi", "L": 1024, "ms": 0.5, "B": 2},
                            {"impl": "ffi", "L": 256, "us": 100.0, "B": 2},
                            {"name": "xla", "seqlen": 256, "s": 0.002}])
    assert got == {"ffi (B=2)": [(256, 0.1), (1024, 0.5)], "xla": [(256, 2.0)]}
    with pytest.raises(ValueError):
        bench_cmd.series([{"impl": "ffi", "ms": 1.0}])


def test_bench_sweep_records():
    recs = bench_cmd.sweep("cpu", lengths=[32, 64], B=1, D=8, reps=1, log=lambda *a: None)
    assert {(r["impl"], r["L"], r["pass"]) for r in recs} == {
        (i, L, p) for i in ("ours", "lax.conv_general_dilated", "XLA shifted sum")
        for L in (32, 64) for p in ("fwd", "fwd+bwd")}
    assert all(r["ms"] > 0 for r in recs)
    labels = bench_cmd.series(recs)
    assert labels["ours (pass=fwd)"][0][0] == 32
    # the lax baseline computes the same convolution as ours
    x = jax.random.normal(jax.random.key(0), (2, 16, 8))
    w = jax.random.normal(jax.random.key(1), (8, 4))
    b = jax.random.normal(jax.random.key(2), (8,))
    impls = bench_cmd._impls()
    for fn in impls.values():
        np.testing.assert_allclose(fn(x, w, b), jcc.reference.causal_conv1d(
            x, w, b, channels_last=True), rtol=1e-5, atol=1e-5)


def test_main_defaults_to_demo(monkeypatch):
    seen = {}
    monkeypatch.setattr(demo, "run", lambda args: seen.setdefault("args", args) and 0)
    assert main(["--steps", "7", "--width", "3"]) == 0
    a = seen["args"]
    assert (a.command, a.steps, a.width, a.layers, a.platform) == ("demo", 7, 3, 4, "auto")
