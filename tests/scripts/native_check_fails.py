"""A pytest plugin for tests/scripts/test_gpu_check.py (``-p tests.scripts.native_check_fails``): every
device-parametrized native test fails, as a native op broken on a new device would make it."""
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    if "on_the_device" in item.name:
        pytest.fail("injected: the native ops disagree with the Python kernels on this device")
