"""The selection language of docs/selection.md, on a hand-built graph."""

from __future__ import annotations

import pytest

from clouseau.ir import SelectionError, Selector, select_points

from .graphs import block_graph


def chosen(select) -> list[str]:
    return [p.name for p in select_points(block_graph(), select)]


def test_glob_without_dot_matches_last_component_and_op():
    assert chosen("relu*") == ["layer1.0.relu", "layer1.0.relu_1"]
    assert chosen("conv2d") == ["conv1", "layer1.0.conv1"]  # by op


def test_glob_with_dot_matches_full_name():
    assert chosen("layer1.*") == [
        "layer1.0.conv1", "layer1.0.bn1", "layer1.0.relu", "layer1.0.add", "layer1.0.relu_1", "layer1.0",
    ]  # fmt: skip
    assert chosen("layer1.0") == ["layer1.0"]


def test_list_with_exclusion():
    assert chosen(["conv*", "!layer1.*"]) == ["conv1"]
    assert chosen(["!*.relu*"]) == [
        n for n in block_graph().names() if not n.startswith("layer1.0.relu")
    ]


def test_callable_and_selector_algebra():
    assert chosen(lambda p: p.module_type == "Linear") == ["fc"]
    sel = Selector.in_module("layer1.0") & ~Selector.op("relu", "add")
    assert chosen(sel) == ["layer1.0.conv1", "layer1.0.bn1"]
    assert chosen(Selector.glob("fc") | Selector.module_type("BatchNorm2d")) == [
        "layer1.0.bn1",
        "fc",
    ]


def test_star_selects_every_point():
    assert chosen("*") == list(block_graph().names())


def test_nothing_matched_lists_close_names():
    with pytest.raises(
        SelectionError, match=r"select 'rleu\*' matched no point.*closest names: relu"
    ):
        chosen("rleu*")
    with pytest.raises(SelectionError, match=r"'layer2\.\*' matched no point.*layer1"):
        chosen(["relu*", "layer2.*"])


@pytest.mark.parametrize("bad", [3, ["relu", 4], object()])
def test_invalid_select_type_is_rejected(bad):
    with pytest.raises(SelectionError, match="select must be a glob string"):
        chosen(bad)


def test_invalid_glob_is_rejected():
    with pytest.raises(SelectionError, match=r"unbalanced"):
        chosen("relu[")
