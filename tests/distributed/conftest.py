"""Fixtures of the distributed tests: a local Ray cluster, started once per module."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.distributed.launch import ROOT


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray cluster of 2 CPUs whose workers import this checkout; shut down after."""
    ray = pytest.importorskip("ray")
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), before or ""])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()
        # Restored: a later test must not inherit this module's PYTHONPATH.
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
