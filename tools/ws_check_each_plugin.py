"""pytest plugin of check-each (ws_checks.ChecksMixin._check_patch): runs
vLLM's global cleanup after each test with its garbage collection narrowed
to the young generations.

vLLM's tests/conftest.py calls cleanup_dist_env_and_memory() after every
test (unless the test is marked `skip_global_cleanup`): it resets the envs
cache, destroys the model-parallel groups and the distributed environment,
then runs a full gc.collect() over the heap that importing vLLM leaves. That
collection costs about half a second a test here, most of a per-patch run
(the 151 tests of offloading_connector/test_config.py: 72 s with it, 4.7 s
without). This plugin marks every test `skip_global_cleanup` and runs the
same cleanup itself after the test's fixtures are torn down, with
gc.collect() collecting generations 0 and 1 only: what the tests of one
test left behind, not the whole import heap again. Skipping the cleanup
outright is not enough: tests/v1/attention/test_kv_cache_spec_tp_shards.py
needs the distributed teardown between tests.

The suites stage (bases/V/upstream-suites.txt) still runs vLLM's suites with
the full cleanup, on the whole series, as vLLM's CI runs them.
"""

import gc
from unittest.mock import patch

import pytest

_collect = gc.collect


def _young_collect(generation: int = 2) -> int:
    return _collect(min(generation, 1))


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.skip_global_cleanup)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    from vllm.distributed import cleanup_dist_env_and_memory

    with patch.object(gc, "collect", _young_collect):
        cleanup_dist_env_and_memory()
