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


def pytest_runtest_logreport(report):
    """A CUDA fault (illegal address) leaves this process's context unusable:
    every later GPU test in it would fail with the same error and hide which
    kernel faulted. Under pytest-xdist the worker exits instead, and xdist
    reports the test as crashed and starts a fresh worker for the rest."""
    if (report.failed and os.environ.get("PYTEST_XDIST_WORKER")
            and "CUDA_ERROR_ILLEGAL_ADDRESS" in str(report.longrepr)):
        os._exit(3)
