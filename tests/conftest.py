import os

# 8 virtual CPU devices for tests/test_sharding.py. XLA reads the flag when jax
# first initialises its backends, so it is set before anything imports jax;
# every other test runs on device 0 as before.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

from helpers import on_cpu  # noqa: E402

# float64 gradient checks need x64; every test names its dtypes explicitly.
jax.config.update("jax_enable_x64", True)

HERE = os.path.dirname(__file__)


def pytest_configure(config):
    config.addinivalue_line("markers", "on_cpu: runs on the CPU device, whatever the "
                                       "default device (tests/helpers.py)")


@pytest.fixture(autouse=True)
def _on_cpu_mark(request):
    with on_cpu(request.node.get_closest_marker("on_cpu") is not None):
        yield


_DEV_DTYPE_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _param_dtypes(value):
    """The dtype names a test parameter holds (a name, a dtype, or a tuple of
    them among other values)."""
    if isinstance(value, (tuple, list)):
        return {n for v in value for n in _param_dtypes(v)}
    if isinstance(value, str):
        return {value} & set(_DEV_DTYPE_NAMES.values())
    try:
        name = jax.numpy.dtype(value).name
    except Exception:  # (not a dtype)
        return set()
    return {name} & set(_DEV_DTYPE_NAMES.values())


def pytest_collection_modifyitems(config, items):
    """A development build of some dtypes' CUDA kernels only (JCC_DEV_DTYPES,
    recorded in _build_info.CUDA_DEV_DTYPES): the GPU tests of the other
    dtypes are skipped, so that no -k filter is needed. (-k matches
    substrings: "not float16" drops every bfloat16 case too.)"""
    try:
        from jax_causal_conv import _build_info
        dev = getattr(_build_info, "CUDA_DEV_DTYPES", "")
    except ImportError:
        dev = ""
    built = {_DEV_DTYPE_NAMES.get(t.strip(), t.strip()) for t in dev.split(",") if t.strip()}
    if not built:
        return
    skip = pytest.mark.skip(reason=f"a development build of the {', '.join(sorted(built))} kernels only")
    for item in items:
        spec = getattr(item, "callspec", None)
        if item.get_closest_marker("gpu") is None or spec is None:
            continue
        if _param_dtypes(tuple(spec.params.values())) - built:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """A CUDA fault (illegal address) leaves this process's context unusable:
    every later GPU test in it would fail with the same error and hide which
    kernel faulted. Under pytest-xdist the worker exits instead, and xdist
    reports the test as crashed and starts a fresh worker for the rest."""
    if (report.failed and os.environ.get("PYTEST_XDIST_WORKER")
            and "CUDA_ERROR_ILLEGAL_ADDRESS" in str(report.longrepr)):
        os._exit(3)
