"""The dynamic tier names as the traced path does (one naming module: docs/names.md).

A model both tiers can run is captured by the traced path (torch.fx) and by the dynamic
tier (TorchDynamo regions, module outputs by forward hooks): every point the traced path
saves is saved by the dynamic tier under the same name with the same value (bitwise), on
every call, at two shapes. The dynamic tier may save more: the ops inside a built-in
module (``bn.batch_norm``), which Dynamo compiles as a frame of its own where a hook on
the module breaks the graph; the traced path keeps such a module one node. A stack of
layers of one class is compiled once by Dynamo and run for each layer: each layer's ops
are saved under its own names (``layer1.1.add``), not the first layer's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import clouseau
from clouseau.capture.torch.dynamic.dynamo import DynamicTier
from clouseau.store import MemorySink
from tests.torch import models

CASES = {
    "MLP": ((3, 8), (5, 8)),
    "CNN": ((2, 3, 8, 8), (3, 3, 8, 8)),
    "ResNet": ((2, 3, 16, 16), (1, 3, 16, 16)),
}


def _inside_a_builtin_module(name: str, model: torch.nn.Module) -> bool:
    path, _, _ = name.rpartition(".")
    module = dict(model.named_modules()).get(path)
    return module is not None and type(module).__module__.startswith("torch.nn")


@pytest.mark.parametrize("name", list(CASES))
def test_the_dynamic_tier_names_as_the_traced_path(name: str) -> None:
    torch.manual_seed(0)
    model = getattr(models, name)().eval()
    fmodel = clouseau.instrument(model, select="*", path=None)
    sink = MemorySink()
    dynamic = DynamicTier(model, "*", sink, None)
    for call, shape in enumerate(CASES[name]):
        x = torch.randn(*shape)
        with torch.no_grad():
            fmodel(x)
            dynamic((x,), {})
        traced, regions = fmodel.captured, sink.capture()
        assert fmodel._tier is None  # the traced path
        names = {n for n in traced.names() if traced.get(n, call=call) is not None}
        assert names, "the traced path saves points"
        for point in names:
            got = regions.get(point, call=call)
            assert got is not None, point
            np.testing.assert_array_equal(got, traced.get(point, call=call), err_msg=point)
        extra = {n for n in regions.names() if regions.get(n, call=call) is not None} - names
        assert all(_inside_a_builtin_module(n, model) for n in extra), sorted(extra)
