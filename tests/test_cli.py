"""The command-line main job: demo training (in-process, few steps), cached
generation == full recomputation, progress in a log, `--quick`, `info` in a
subprocess, the GPU diagnosis and its messages, `--help`, `bench` plumbing
(tests/test_benchmarks.py has the benchmark suite's own tests)."""

import os
import subprocess
import sys
import types

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

import jax_causal_conv as jcc  # noqa: E402
from jax_causal_conv.__main__ import main  # noqa: E402
from jax_causal_conv.cli import bench_cmd, demo, gpu_status  # noqa: E402


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
    lines = {ln[2:18].strip(): ln[19:] for ln in r.stdout.splitlines()[1:]}  # "  key  value"
    # JAX_PLATFORMS=cpu: no GPU, and the line says why
    assert lines["GPU (JAX)"] == "JAX sees no GPU: JAX_PLATFORMS=cpu hides it (unset it)"
    kernels = "loaded" if "cuda" in jcc.PLATFORMS else "not built"
    assert lines["CUDA kernels"].startswith(kernels)
    assert lines["our kernels run"] == "on cpu"


def _fake_build(state, version="", archs=""):
    return types.SimpleNamespace(CUDA_BUILD=state, CUDA_VERSION=version,
                                 CUDA_ARCHITECTURES=archs)


@pytest.fixture
def no_gpu_here(monkeypatch):
    """A machine whose JAX has no GPU, no CUDA plugin and our kernels absent."""
    from jax_causal_conv._lowering import targets
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(gpu_status, "_jax_gpus", lambda: ([], [], "Unknown backend gpu"))
    monkeypatch.setattr(gpu_status, "_cuda_plugins", lambda: [])
    monkeypatch.setattr(gpu_status, "_driver_cuda_version", lambda: None)
    monkeypatch.setattr(gpu_status, "_build_info", lambda: _fake_build("nvcc-not-found"))
    monkeypatch.setattr(targets, "_jcc_cuda", None)
    return monkeypatch


def _with_gpu(mp, cc=(9, 0), loaded=True, build=None, driver=13000):
    from jax_causal_conv._lowering import targets
    name = f"NVIDIA H100 80GB HBM3 (sm_{cc[0]}{cc[1]})"
    mp.setattr(gpu_status, "_jax_gpus", lambda: ([name], [cc], None))
    mp.setattr(gpu_status, "_cuda_plugins", lambda: ["jax-cuda13-plugin 0.10.2"])
    mp.setattr(gpu_status, "_driver_cuda_version", lambda: driver)
    mp.setattr(gpu_status, "_build_info",
               lambda: build or _fake_build("built", "13.0.88", "80;90-real;100-real;120-real"))
    mp.setattr(targets, "_jcc_cuda", object() if loaded else None)


def test_gpu_status_says_why_and_how_to_fix(no_gpu_here):
    mp = no_gpu_here
    st = gpu_status.diagnose()
    assert not st.gpus and not st.kernels_loaded
    assert st.jax_problem.startswith("JAX sees no GPU: this jaxlib is CPU-only")
    assert "pip install 'jax[cuda13]'" in st.jax_problem
    assert "nvcc was not found" in st.kernels_detail
    assert gpu_status.gpu_problem(st) == st.jax_problem      # the JAX side first
    mp.setenv("JAX_PLATFORMS", "cpu")
    assert "JAX_PLATFORMS=cpu hides it" in gpu_status.gpu_problem()
    mp.delenv("JAX_PLATFORMS")
    mp.setattr(gpu_status, "_cuda_plugins", lambda: ["jax-cuda12-plugin 0.10.2"])
    assert "although jax-cuda12-plugin 0.10.2 is installed" in gpu_status.gpu_problem()
    mp.setattr(gpu_status, "_build_info", lambda: _fake_build("disabled"))
    assert "JAX_CAUSAL_CONV_CUDA=OFF" in gpu_status.diagnose().kernels_detail
    mp.setattr(gpu_status, "_build_info", lambda: None)
    assert "tools/dev_build_cpu.sh" in gpu_status.diagnose().kernels_detail


def test_gpu_status_with_a_gpu(no_gpu_here):
    mp = no_gpu_here
    _with_gpu(mp)
    st = gpu_status.diagnose()
    assert st.gpus == ["NVIDIA H100 80GB HBM3 (sm_90)"] and st.kernels_loaded
    assert st.kernels_detail == "loaded (built with CUDA 13.0.88 for 80;90-real;100-real;120-real)"
    assert gpu_status.gpu_problem(st) is None
    dev = _fake_build("built", "13.0.88", "90")
    dev.CUDA_DEV_DTYPES = "bf16"  # (tools/device_build.sh with JCC_DEV_DTYPES=bf16)
    _with_gpu(mp, build=dev)
    assert gpu_status.diagnose().kernels_detail == ("loaded (built with CUDA 13.0.88 for 90; a development "
                                                    "build: the bf16 kernels only)")
    _with_gpu(mp, loaded=False, build=_fake_build("nvcc-not-found"))
    p = gpu_status.gpu_problem()
    assert p.startswith("JAX sees NVIDIA H100 80GB HBM3 (sm_90), but our CUDA kernels are not "
                        "built: nvcc was not found")
    _with_gpu(mp, loaded=False)                              # built, but the import failed
    assert "built but failed to load" in gpu_status.gpu_problem()
    _with_gpu(mp, cc=(7, 5))
    assert "older than the kernels' minimum sm_80" in gpu_status.gpu_problem()
    _with_gpu(mp, driver=12040)
    assert gpu_status.gpu_problem().startswith("the NVIDIA driver supports CUDA 12.4, but these "
                                               "kernels were built with CUDA 13.0.88")


def test_demo_and_info_platform_gpu_fail_with_the_message(no_gpu_here, capsys):
    assert main(["demo", "--platform", "gpu", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jax-causal-conv demo: --platform gpu: JAX sees no GPU: this jaxlib "
                          "is CPU-only")
    assert "Traceback" not in err
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "CPU-only; pip install 'jax[cuda13]'" in out and "nvcc was not found" in out
    assert "our kernels run  on cpu\n" in out


def test_help_parses_for_every_command(capsys):
    for argv in (["--help"], ["demo", "--help"], ["info", "--help"], ["bench", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0, argv
        assert "usage: jax-causal-conv" in capsys.readouterr().out


def test_demo_quick_preset_and_explicit_options_win():
    from jax_causal_conv.__main__ import build_parser
    a = demo.resolve(build_parser().parse_args(["demo", "--quick", "--steps", "5"]))
    assert (a.steps, a.layers, a.dim, a.generate) == (5, demo.QUICK["layers"],
                                                      demo.QUICK["dim"], demo.QUICK["generate"])
    a = demo.resolve(build_parser().parse_args(["demo"]))
    assert {k: getattr(a, k) for k in demo.FULL} == demo.FULL


def test_demo_progress_in_a_log_is_plain_lines(capsys):
    bar = demo._Progress(20)             # stdout is captured here: not a terminal
    for i in range(1, 21):
        bar.update(i, 5.0 - i / 10, 1234.0)
    bar.close()
    out = capsys.readouterr().out
    assert "\r" not in out and "\x1b" not in out
    lines = out.splitlines()
    assert len(lines) == 10 and lines[-1] == "  step    20/20  loss  3.000      1,234 tok/s"


def test_quick_demo_runs_end_to_end(capsys):
    assert main(["--quick", "--platform", "cpu", "--steps", "12", "--generate", "16"]) == 0
    out = capsys.readouterr().out
    assert "\r" not in out
    assert "convolution by our FFI kernels" in out
    assert "cached decoding vs full recomputation" in out and out.rstrip().endswith("OK")


def _no_gpu():
    try:
        return not jax.devices("gpu")
    except RuntimeError:
        return True


@pytest.mark.skipif(not _no_gpu(), reason="a GPU is visible here")
def test_bench_gpu_without_gpu_is_one_clear_sentence(no_gpu_here, capsys):
    """bench fails with the one message demo and info give (gpu_status)."""
    assert main(["bench", "--platform", "gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err == "bench --platform gpu: " + gpu_status.gpu_problem()
    assert err.startswith("bench --platform gpu: JAX sees no GPU: this jaxlib is CPU-only")
    assert "pip install 'jax[cuda13]'" in err


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
    a = demo.resolve(seen["args"])
    assert (a.command, a.steps, a.width, a.layers, a.platform) == ("demo", 7, 3, 4, "auto")
