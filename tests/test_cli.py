"""The command-line main job: demo training (in-process, few steps), cached
generation == full recomputation, `info` in a subprocess, `bench` plumbing
(tests/test_benchmarks.py has the benchmark suite's own tests)."""

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


def _no_gpu():
    try:
        return not jax.devices("gpu")
    except RuntimeError:
        return True


@pytest.mark.skipif(not _no_gpu(), reason="a GPU is visible here")
def test_bench_gpu_without_gpu_is_one_clear_sentence(capsys):
    assert main(["bench", "--platform", "gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "JAX sees no GPU" in err and 'pip install "jax[cuda13]"' in err
    assert ("CUDA kernels are not loaded" in err) == ("cuda" not in jcc.PLATFORMS)


def _fake_quick(monkeypatch):
    from jax_causal_conv.cli import quick_bench
    res = dict(platform="cpu", shape=(1, 8, 64), dtype="float32",
               rows=[dict(W=4, impl=i, fwd_ms=1.0 + k, step_ms=2.0 + k)
                     for k, i in enumerate(quick_bench.IMPLS)])
    monkeypatch.setattr(quick_bench, "measure", lambda platform, progress=None: res)


def test_bench_without_a_checkout_runs_the_packaged_benchmark(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_cmd, "find_suite", lambda: None)
    _fake_quick(monkeypatch)
    assert main(["bench", "--platform", "cpu"]) == 0          # markdown to stdout
    out = capsys.readouterr()
    assert "| 4 | XLA shifted sum | 2.000 | 3.000 | 2.00x / 1.50x |" in out.out
    assert "no benchmarks/ folder" in out.err
    md = tmp_path / "b.md"
    assert main(["bench", "--platform", "cpu", "--output", str(md)]) == 0
    assert "<!-- cpu-quick:start -->" in md.read_text()
    assert "| 4 | lax.conv |" not in capsys.readouterr().out   # nothing on stdout then
    # options that need the full suite are refused, not ignored
    assert main(["bench", "--platform", "cpu", "--widths", "4"]) == 2
    assert "--widths need the repository's benchmarks/" in capsys.readouterr().err


def test_bench_quick_runs_the_packaged_benchmark_in_a_checkout(monkeypatch, capsys):
    _fake_quick(monkeypatch)
    monkeypatch.setattr(bench_cmd, "find_suite", lambda: pytest.fail("--quick took the suite"))
    assert main(["bench", "--quick", "--platform", "cpu"]) == 0
    assert "| 4 | ours | 1.000 | 2.000 |  |" in capsys.readouterr().out


def test_bench_suite_in_a_checkout(monkeypatch, capsys):
    suite = bench_cmd.find_suite()
    if suite is None:
        pytest.skip("not a checkout")
    assert hasattr(suite, "run_suite")
    assert main(["bench", "--platform", "cpu", "--sections", "matrix,bogus"]) == 2
    assert "--sections: unknown bogus" in capsys.readouterr().err
    assert main(["bench", "--platform", "cpu", "--sections", "decode", "--widths", "4"]) == 2
    assert "only apply to the matrix" in capsys.readouterr().err
    assert main(["bench", "--platform", "cpu", "--sections", "matrix", "--modes", "sparse"]) == 2
    assert "--modes: unknown value 'sparse'" in capsys.readouterr().err


def test_main_defaults_to_demo(monkeypatch):
    seen = {}
    monkeypatch.setattr(demo, "run", lambda args: seen.setdefault("args", args) and 0)
    assert main(["--steps", "7", "--width", "3"]) == 0
    a = seen["args"]
    assert (a.command, a.steps, a.width, a.layers, a.platform) == ("demo", 7, 3, 4, "auto")
