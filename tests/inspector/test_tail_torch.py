"""inspector.tail on PyTorch models, checked against forward hooks on the original model."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from clouseau import inspector  # noqa: E402

Filter = Callable[[tuple[str, ...], Any], bool]


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(width, 2 * width)
        self.act = nn.ReLU()
        self.linear2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear2(self.act(self.linear1(x)))


class Net(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(3, width)
        self.blocks = nn.ModuleList([Block(width), Block(width)])
        self.head = nn.Sequential(nn.Tanh(), nn.Linear(width, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        h = self.blocks[0](h)  # a shared block: its second call is "blocks.0_1"
        return self.head(h)


def hooked(model: nn.Module, *args: Any, filter_: Filter | None = None) -> dict[str, np.ndarray]:
    """The seed's own method: forward hooks on the chosen modules, one call of the model."""
    filter_ = filter_ or (lambda path, node: True)
    seen: dict[str, list[np.ndarray]] = {}
    handles = []
    for name, module in model.named_modules():
        path = tuple(name.split(".")) if name else ()
        try:
            chosen = filter_(path, module)
        except IndexError:  # path[-1] at the root
            chosen = False
        if chosen:
            handles.append(
                module.register_forward_hook(
                    lambda m, i, o, name=name: seen.setdefault(name, []).append(
                        o.detach().clone().numpy()
                    )
                )
            )
    with torch.no_grad():
        model(*args)
    for handle in handles:
        handle.remove()
    out = {}
    for name, outputs in seen.items():
        for k, value in enumerate(outputs):
            stem = name if k == 0 else f"{name}_{k}"
            out[f"{stem}.__call__" if stem else "__call__"] = value
    return out


def assert_same(got: dict[str, Any], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_array_equal(np.asarray(got[key]), value, err_msg=key)


def test_seed_docstring_example_runs_as_written() -> None:
    import torch

    from clouseau import inspector, magnifier

    model = torch.nn.Linear(10, 5)
    with inspector.tail(model, path=".clouseau/trace-torch.safetensors") as fmodel:
        out = fmodel(torch.randn(3, 10))

    data = inspector.read_from_safetensors(".clouseau/trace-torch.safetensors")
    assert list(data) == ["__call__"]
    np.testing.assert_array_equal(data["__call__"], out.detach().numpy())
    assert Path(".clouseau/trace-torch/activations-000.safetensors").is_file()
    magnifier.magnify(".clouseau/trace-torch.safetensors")


def test_default_records_every_module_like_hooks() -> None:
    model, x = Net().eval(), torch.randn(5, 3)
    with inspector.tail(model, path="run") as fmodel:
        y = fmodel(x)
    np.testing.assert_array_equal(y.detach().numpy(), model(x).detach().numpy())
    data = inspector.read_from_safetensors("run")
    assert_same(data, hooked(model, x))
    assert "blocks.0_1.__call__" in data and "head.1.__call__" in data


LINEARS = {
    f"blocks.{b}.linear{i}{r}.__call__"
    for b, r in [("0", ""), ("1", ""), ("0", "_1")]
    for i in (1, 2)
}


@pytest.mark.parametrize(
    ("filter_", "keys"),
    [
        pytest.param(
            lambda path, node: isinstance(node, nn.Linear),
            {*LINEARS, "embed.__call__", "head.1.__call__"},
            id="by-class",
        ),
        pytest.param(lambda path, node: "linear" in path[-1], LINEARS, id="by-path"),
    ],
)
def test_filter_records_exactly_the_chosen_modules(filter_: Filter, keys: set[str]) -> None:
    model, x = Net().eval(), torch.randn(2, 3)
    with inspector.tail(model, path="run", filter_=filter_) as fmodel:
        fmodel(x)
    want = hooked(model, x, filter_=filter_)
    assert set(want) == keys
    assert_same(inspector.read_from_safetensors("run"), want)


def test_filter_and_is_leaf_see_tuples_of_strings() -> None:
    seen: list[tuple[str, ...]] = []

    def filter_(path: tuple[str, ...], node: Any) -> bool:
        seen.append(path)
        return isinstance(node, Block)

    model, x = Net().eval(), torch.randn(2, 3)
    with inspector.tail(
        model, path="run", filter_=filter_, is_leaf=lambda p, n: isinstance(n, Block)
    ) as fmodel:
        fmodel(x)
    assert all(isinstance(p, tuple) and all(isinstance(s, str) for s in p) for p in seen)
    assert ("blocks", "0") in seen and ("blocks", "0", "linear1") not in seen  # descent stopped
    assert sorted(inspector.read_from_safetensors("run")) == [
        "blocks.0.__call__", "blocks.0_1.__call__", "blocks.1.__call__"
    ]  # fmt: skip


def test_five_calls_are_all_kept() -> None:
    model = Net().eval()
    xs = [torch.randn(2, 3) for _ in range(5)]
    with inspector.tail(model, path="run") as fmodel:
        for x in xs:
            fmodel(x)
    data = inspector.read_from_safetensors("run")
    for call, x in enumerate(xs):
        suffix = f"#{call}" if call else ""
        want = {key + suffix: value for key, value in hooked(model, x).items()}
        assert_same({k: v for k, v in data.items() if k in want}, want)
    assert len(data) == 5 * len(hooked(model, xs[0]))


def test_files_roll_over_at_max_size_mb() -> None:
    model, x = Net(width=64).eval(), torch.randn(64, 3)  # 64x64 float32: 16 KiB per module
    with inspector.tail(
        model, path="run", max_size_mb=0.03, filename_pattern="part-{idx:02d}.safetensors"
    ) as fmodel:
        fmodel(x)
    files = sorted(Path("run").glob("part-*.safetensors"))
    assert len(files) > 3
    pieces: dict[str, np.ndarray] = {}
    for file in files:
        piece = inspector.read_from_safetensors(file)
        assert not set(piece) & set(pieces)
        pieces.update(piece)
        assert file.stat().st_size <= 0.03 * 2**20 or len(piece) == 1
    assert list(pieces) == list(inspector.read_from_safetensors("run"))
    assert_same(pieces, hooked(model, x))


def test_two_nested_recorders_stay_isolated() -> None:
    a, b = Net().eval(), nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    xa, xb = torch.randn(2, 3), torch.randn(4, 3)
    with inspector.tail(a, path="a") as fa:
        with inspector.tail(b, path="b", filter_=lambda p, n: isinstance(n, nn.ReLU)) as fb:
            fa(xa)
            fb(xb)
            fb(xb)
        fa(xa)
    assert_same(
        inspector.read_from_safetensors("b"),
        {"1.__call__": hooked(b, xb)["1.__call__"], "1.__call__#1": hooked(b, xb)["1.__call__"]},
    )
    want = hooked(a, xa)
    assert_same(
        inspector.read_from_safetensors("a"), {**want, **{k + "#1": v for k, v in want.items()}}
    )


def test_bfloat16_round_trips_to_every_framework() -> None:
    model, x = Net().to(torch.bfloat16).eval(), torch.randn(2, 3, dtype=torch.bfloat16)
    with inspector.tail(model, path="run") as fmodel:
        fmodel(x)
    as_torch = inspector.read_from_safetensors("run", framework="torch", device="cpu")
    with torch.no_grad():
        want = model(x)
    assert as_torch["__call__"].dtype is torch.bfloat16
    assert torch.equal(as_torch["__call__"], want)
    as_numpy = inspector.read_from_safetensors("run")
    assert as_numpy["__call__"].dtype.name == "bfloat16"
    inspector.magnify("run")


def test_nothing_chosen_warns_and_runs_the_model(caplog: pytest.LogCaptureFixture) -> None:
    model, x = Net().eval(), torch.randn(2, 3)
    with (
        caplog.at_level(logging.WARNING),
        inspector.tail(model, path="run", filter_=lambda p, n: False) as fmodel,
    ):
        y = fmodel(x)
    np.testing.assert_array_equal(y.detach().numpy(), model(x).detach().numpy())
    assert "No arrays were recorded" in caplog.text
    assert inspector.read_from_safetensors("run") == {}


def test_new_input_shapes_and_a_later_plain_capture() -> None:
    import clouseau

    model, x2, x3 = Net().eval(), torch.randn(2, 3), torch.randn(3, 3)
    with inspector.tail(model, path="run") as fmodel:
        fmodel(x2)
        fmodel(x3)  # a second signature: a second graph, same keys
    want = {**hooked(model, x2), **{k + "#1": v for k, v in hooked(model, x3).items()}}
    assert_same(inspector.read_from_safetensors("run"), want)
    # A plain capture replacing the tail's is read under its own point names.
    with clouseau.instrument(model, select="head", path="run") as fmodel:
        fmodel(x2)
    assert list(inspector.read_from_safetensors("run")) == ["head"]
