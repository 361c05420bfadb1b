"""FLOPs and parameter counts of traced torch and JAX models against textbook formulas."""

from __future__ import annotations

import math

import pytest

import clouseau
from clouseau.ir.flops import node_flops
from clouseau.ir.tables import capture_frame


def _flops(graph: clouseau.Graph, name: str) -> int | None:
    return node_flops(graph, graph.node(name))


def test_torch_linear_conv_and_params_match_the_textbook():
    torch = pytest.importorskip("torch")
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 6, (3, 5), stride=2, padding=1, groups=2)
            self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False)
            self.fc = nn.Linear(6, 7)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.nn.functional.conv2d(
                self.dw(self.conv(x)), self.dw.weight, padding=1, groups=6
            )
            return self.fc(h.mean(dim=(2, 3)))

    model, x = Net(), torch.randn(3, 4, 9, 11)
    g = clouseau.trace(model, x)

    def conv_textbook(conv: nn.Conv2d, out: torch.Tensor) -> int:
        n, cout, hout, wout = out.shape
        kh, kw = conv.kernel_size
        return 2 * conv.in_channels // conv.groups * kh * kw * cout * hout * wout * n

    with torch.no_grad():
        conv_out = model.conv(x)
        dw_out = model.dw(conv_out)
    assert _flops(g, "conv") == conv_textbook(model.conv, conv_out)
    assert _flops(g, "dw") == conv_textbook(model.dw, dw_out)
    (functional,) = [n.name for n in g.nodes if n.op == "conv2d" and not n.module]
    assert _flops(g, functional) == conv_textbook(model.dw, dw_out)
    assert _flops(g, "fc") == 2 * 6 * 7 * 3
    for path, module in model.named_modules():
        assert g.module(path).params == sum(p.numel() for p in module.parameters())
    for node in g.nodes:
        if node.module and g.module(node.module) is not None:
            assert clouseau.ir.metadata.module_params(g, node) == sum(
                p.numel() for p in model.get_submodule(node.module).parameters()
            )


def test_torch_capture_to_pandas_has_a_row_per_saved_array():
    torch = pytest.importorskip("torch")
    pytest.importorskip("pandas")
    from ..torch.models import MLP

    model = MLP()
    fmodel = clouseau.instrument(model, select=["fc1", "act"], path=None, grads="fc1")
    for _ in range(2):
        fmodel(torch.randn(2, 8)).sum().backward()
    cap = fmodel.captured
    frame = capture_frame(cap.records, cap.graphs)
    assert list(frame["name"]) == [r.name for r in cap.records]
    assert sorted(frame["call"].unique()) == [0, 1]
    fc1 = frame[frame["name"] == "fc1"].iloc[0]
    assert fc1["flops"] == 2 * 8 * 16 * 2 and fc1["module_type"] == "Linear"
    assert fc1["module_params"] == sum(p.numel() for p in model.fc1.parameters())
    assert frame[frame["name"] == "fc1.grad"]["grad"].all()


def test_jax_dot_general_conv_and_params_match_the_textbook():
    jax = pytest.importorskip("jax")
    eqx = pytest.importorskip("equinox")

    class Net(eqx.Module):
        conv: eqx.nn.Conv2d
        fc: eqx.nn.Linear

        def __init__(self, key: jax.Array) -> None:
            k1, k2 = jax.random.split(key)
            self.conv = eqx.nn.Conv2d(4, 6, (3, 5), stride=2, padding=1, groups=2, key=k1)
            self.fc = eqx.nn.Linear(6, 7, key=k2)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.fc(self.conv(x).mean(axis=(1, 2)))

    model, x = Net(jax.random.PRNGKey(0)), jax.numpy.ones((4, 9, 11))
    g = clouseau.trace(model, x)
    conv = next(n for n in g.nodes if n.op == "conv_general_dilated")
    cout, hout, wout = jax.eval_shape(model.conv, x).shape
    assert _flops(g, conv.name) == 2 * 4 // 2 * 3 * 5 * cout * hout * wout * 1
    dot = next(n for n in g.nodes if n.op == "dot_general" and n.module == "fc")
    assert _flops(g, dot.name) == 2 * 6 * 7 * 1
    for path in ("conv", "fc"):
        leaves = jax.tree_util.tree_leaves(getattr(model, path))
        assert g.module(path).params == sum(math.prod(a.shape) for a in leaves)
    assert g.module("").params == sum(math.prod(a.shape) for a in jax.tree_util.tree_leaves(model))


def test_jax_batched_dot_general_counts_its_contraction():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def attention_scores(q: jax.Array, k: jax.Array) -> jax.Array:
        return jnp.einsum("bhqd,bhkd->bhqk", q, k)

    q, k = jnp.ones((2, 3, 5, 4)), jnp.ones((2, 3, 7, 4))
    g = clouseau.trace(attention_scores, q, k)
    dot = next(n for n in g.nodes if n.op == "dot_general")
    assert _flops(g, dot.name) == 2 * 4 * (2 * 3 * 5 * 7)
