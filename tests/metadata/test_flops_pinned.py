"""FLOPs of a torch and a JAX model pinned node by node.

The numbers were taken from the FLOP rules when they were keyed on op spellings, before
the frontends set an op category on each node: a refactor of the rules or of the builders
must leave every count as it was. Nodes not listed count 0; none is unknown.
"""

from __future__ import annotations

import pytest

import clouseau
from clouseau.ir.metadata import node_flops, total_flops

from .pinned_models import jax_model, torch_model

TORCH_FLOPS = {
    "conv": 27648,
    "bn": 2048,
    "act": 512,
    "pool": 512,
    "up": 2048,
    "avg": 256,
    "fc": 64,
    "norm": 80,
    "add": 80,
    "attn:tuple": 6720,
    "scaled_dot_product_attention": 1600,
    "matmul": 800,
    "softmax": 250,
    "sum": 50,
    "gelu": 80,
    "mul": 80,
    "gn": 400,
    "addmm": 256,
    "mean": 16,
    "tanh": 80,
    "amax": 80,
    "add_1": 1,
}
JAX_FLOPS = {
    "dot_general": 384,
    "relu": 32,
    "softmax": 160,
    "gelu": 32,
    "add": 32,
    "conv_general_dilated": 7776,
    "reduce_window_max": 144,
    "scan.mul": 8,
    "scan.add": 8,
    "scan.tanh": 8,
    "scan.reduce_sum": 8,
    "bij_bjk-_bik.dot_general": 128,
    "reduce_sum": 8,
    "div": 1,
    "reduce_max": 4,
    "add_1": 1,
    "reduce_sum_1": 36,
    "add_2": 1,
    "exp": 8,
    "reduce_sum_2": 8,
    "add_3": 1,
    "sigmoid": 32,
    "argmax": 32,
    "add_4": 1,
}


def _check(graph: clouseau.Graph, pinned: dict[str, int]) -> None:
    counted = {n.name: node_flops(graph, n) for n in graph.nodes}
    assert {k: v for k, v in counted.items() if v != 0} == pinned
    assert total_flops(graph) == sum(pinned.values())


def test_torch_flops_are_pinned():
    pytest.importorskip("torch")
    model, args = torch_model()
    _check(clouseau.trace(model, *args), TORCH_FLOPS)


def test_jax_flops_are_pinned():
    pytest.importorskip("jax")
    model, args = jax_model()
    graph = clouseau.trace(model, *args)
    # scan bodies run once per iteration (4 of them)
    assert total_flops(graph) == sum(JAX_FLOPS.values()) + 3 * 4 * 8
    counted = {n.name: node_flops(graph, n) for n in graph.nodes}
    assert {k: v for k, v in counted.items() if v != 0} == JAX_FLOPS
