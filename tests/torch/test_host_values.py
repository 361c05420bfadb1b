"""The host arrays of a traced call: what is shared, what is copied, and that every value
equals the eager one (views, in-place ops in residual blocks, outputs, a second call)."""

from __future__ import annotations

import numpy as np
import torch

from clouseau.capture import torch as ct
from tests.conftest import RecordingSink


class _Views(torch.nn.Module):
    """A value, strided views of it (a transpose, a slice) and a slice of a value that is
    not saved with it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h.t().sum(0) + h[:, ::2].sum(1).sum() + torch.relu(h)[:, 1::3].sum()


def _eager(model: _Views, x: torch.Tensor) -> dict[str, np.ndarray]:
    h = model.fc(x)
    r = torch.relu(h)
    return {"fc": h, "t": h.t(), "getitem": h[:, ::2], "getitem_1": r[:, 1::3]}


def _put(sink: RecordingSink, call: int) -> dict[str, np.ndarray]:
    return {value.names[0]: value.array for _, value in sink.calls[call]}


def _held(array: np.ndarray) -> int:
    """The bytes of memory ``array`` keeps alive (its base's, a tensor's storage)."""
    base = array.base
    if base is None:
        return array.nbytes
    if isinstance(base, torch.Tensor):
        return base.untyped_storage().nbytes()
    return _held(base)


def test_strided_views_of_saved_values_share_their_memory() -> None:
    torch.manual_seed(0)
    model, sink = _Views(), RecordingSink()
    fm = ct.instrument(model, select=["fc", "t", "getitem", "getitem_1"], sink=sink)
    with torch.no_grad():
        for call in range(3):  # the first call (the probe's own values), then later ones
            x = torch.randn(4, 6)
            fm(x)
            want = _eager(model, x)
            got = _put(sink, call)
            for name, value in want.items():
                np.testing.assert_array_equal(got[name], value.numpy())
            if call:
                # A view of a saved value is handed over as the view it is: no second copy.
                assert np.shares_memory(got["t"], got["fc"])
                assert np.shares_memory(got["getitem"], got["fc"])
            # A slice of a value not saved is a compact copy: it does not keep its base.
            assert got["getitem_1"].flags.c_contiguous
            assert _held(got["getitem_1"]) == got["getitem_1"].nbytes


class _Residual(torch.nn.Module):
    """A residual block with an in-place ReLU after a saved view of the sum."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x) + x
        v = h.t()
        h.relu_()  # changes v's storage after v is made
        return h * 2, v[0]


def test_views_of_values_changed_in_place_later_are_snapshots() -> None:
    torch.manual_seed(1)
    model, sink = _Residual(), RecordingSink()
    fm = ct.instrument(model, select="*", sink=sink)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 5)
            out = fm(x)
            h = model.fc(x) + x
            got = _put(sink, len(sink.calls) - 1)
            np.testing.assert_array_equal(got["add"], h.numpy())
            np.testing.assert_array_equal(got["t"], h.t().numpy())
            np.testing.assert_array_equal(got["relu_"], torch.relu(h).numpy())
            # The outputs escape: what the user does to them later is not seen.
            expected = {"mul": out[0].clone(), "getitem": out[1].clone()}
            out[0].mul_(3.0)
            out[1].add_(1.0)
            for name, value in expected.items():
                np.testing.assert_array_equal(got[name], value.numpy())


def test_values_that_require_grad_are_saved_as_eager() -> None:
    torch.manual_seed(2)
    model, sink = _Views(), RecordingSink()
    fm = ct.instrument(model, select=["fc", "t", "getitem_1"], sink=sink)
    for _ in range(2):
        x = torch.randn(4, 6, requires_grad=True)
        fm(x).sum().backward()
        want = _eager(model, x)
        got = _put(sink, len(sink.calls) - 1)
        for name in ("fc", "t", "getitem_1"):
            np.testing.assert_array_equal(got[name], want[name].detach().numpy())
