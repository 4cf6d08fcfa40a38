"""Suite-wide: under pytest-xdist, the tests that build network namespaces run one at a time on
one worker: they claim subnets and check that the host is left as they found it."""
from pathlib import Path

import pytest

_NETNS_FILES = {"test_restart_and_network.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if item.get_closest_marker("root") or path.parent.name == "cluster" or path.name in _NETNS_FILES:
            item.add_marker(pytest.mark.xdist_group("netns"))
