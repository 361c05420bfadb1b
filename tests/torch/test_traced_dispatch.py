"""A traced call skips nn.Module's dispatch only when it has nothing to run: hooks added
later (the instrumented model's own, process-wide) still run, and values stay right."""

from __future__ import annotations

import numpy as np
import torch

from clouseau.capture import torch as ct
from tests.conftest import RecordingSink


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def test_hooks_added_after_the_first_call_run() -> None:
    torch.manual_seed(0)
    model, sink = _Net(), RecordingSink()
    fm = ct.instrument(model, select=["fc", "tanh"], sink=sink)
    x = torch.randn(2, 4)
    fm(x)  # the trace
    seen: list[str] = []
    own = fm.register_forward_hook(lambda m, i, o: seen.append("own"))
    pre = fm.register_forward_pre_hook(lambda m, i: seen.append("pre"))
    glob = torch.nn.modules.module.register_module_forward_hook(
        lambda m, i, o: seen.append(type(m).__name__) if m is fm else None
    )
    try:
        out = fm(x)
    finally:
        own.remove(), pre.remove(), glob.remove()
    assert seen == ["pre", "InstrumentedModule", "own"]
    fm(x)  # no hooks left: the direct call
    assert len(seen) == 3
    want = torch.tanh(model.fc(x))
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for call in (1, 2):
        got = {v.names[0]: v.array for _, v in sink.calls[call]}
        np.testing.assert_array_equal(got["fc"], model.fc(x).detach().numpy())
        np.testing.assert_array_equal(got["tanh"], want.detach().numpy())
