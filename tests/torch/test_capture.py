"""Captured values equal the eager values at the same points; outputs are unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clouseau.capture import torch as ct
from clouseau.ir.graph import TraceKind
from tests.conftest import RecordingSink
from tests.torch import models
from tests.torch.conftest import assert_same, eager_with_hooks


def run(model: torch.nn.Module, sink: RecordingSink, *args, select="*", **kwargs):  # type: ignore[no-untyped-def]
    fm = ct.instrument(model, select=select, sink=sink)
    with torch.no_grad():
        out = fm(*args, **kwargs)
    return out, sink.values(), fm


def test_mlp_every_point(sink: RecordingSink) -> None:
    model = models.MLP()
    x = torch.randn(3, 8)
    expected, hooks = eager_with_hooks(model, x)
    out, cap, _ = run(model, sink, x)
    assert_same(out, expected)
    assert set(cap) == set(sink.graphs[0].names())
    assert_same(cap["x"], x)
    for path in ("fc1", "act", "fc2"):
        assert_same(cap[path], hooks.outputs[path][0])
    assert sink.status == ["end"]


def test_cnn_batchnorm_inplace_relu_train(sink: RecordingSink) -> None:
    model = models.CNN().train()
    reference = models.CNN().train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 6, 6)
    expected, hooks = eager_with_hooks(reference, x)
    out, cap, _ = run(model, sink, x)
    assert_same(out, expected)
    for path in ("conv", "bn", "relu", "pool", "head"):
        assert_same(cap[path], hooks.outputs[path][0])
    assert (cap["bn"] < 0).any()  # the snapshot precedes ReLU(inplace=True)
    assert_same(cap["flatten"], torch.flatten(hooks.outputs["pool"][0], 1))
    # The instrumented call updates the running statistics exactly as eager does.
    assert_same(model.bn.running_mean, reference.bn.running_mean)
    assert int(model.bn.num_batches_tracked) == 1


def test_resnet_every_point(sink: RecordingSink) -> None:
    model = models.ResNet().eval()
    x = torch.randn(2, 3, 16, 16)
    expected, hooks = eager_with_hooks(model, x)
    out, cap, _ = run(model, sink, x)
    assert_same(out, expected)
    for name in sink.graphs[0].names():
        if name in hooks.outputs:  # module outputs, incl. aliases such as layer1.0
            assert_same(cap[name], hooks.outputs[name][0])
    for block in ("layer1.0", "layer1.1", "layer2.0", "layer2.1"):
        assert_same(cap[f"{block}.relu"], hooks.outputs[f"{block}.relu"][0])
        assert_same(cap[f"{block}.relu_1"], hooks.outputs[f"{block}.relu"][1])
        # the sum before the in-place ReLU is what the second relu call received
        assert_same(cap[f"{block}.add"], hooks.inputs[f"{block}.relu"][1][0])
        assert_same(cap[f"{block}.bn1"], hooks.inputs[f"{block}.relu"][0][0])
        assert (cap[f"{block}.add"] < 0).any() and (cap[f"{block}.bn1"] < 0).any()
    assert_same(cap["flatten"], torch.flatten(hooks.outputs["avgpool"][0], 1))


def test_one_value_saved_once_with_all_its_names(sink: RecordingSink) -> None:
    run(
        models.ResNet().eval(),
        sink,
        torch.randn(1, 3, 16, 16),
        select=["layer1.0.relu_1", "layer1.0"],
    )
    (saved,) = [v for _, v in sink.calls[0]]
    assert saved.names == ("layer1.0.relu_1", "layer1.0") and saved.node == "layer1.0.relu_1"


def test_snapshots_only_where_a_later_op_mutates(sink: RecordingSink) -> None:
    fm = ct.instrument(models.ResNet().eval(), select="*", sink=sink)
    lowered = fm.lowered(torch.randn(1, 3, 16, 16))
    clones = [n for n in lowered.module.graph.nodes if n.target is torch.clone]
    by_key = {n.key: n.name for n in lowered.graph.nodes}
    cloned = {by_key[n.args[0].name] for n in clones}
    # relu(inplace) mutates bn1 and the block sum, "out += identity" mutates bn2; no
    # other value is copied.
    blocks = ("layer1.0", "layer1.1", "layer2.0", "layer2.1")
    assert cloned == {"bn1"} | {f"{b}.{n}" for b in blocks for n in ("bn1", "bn2", "add")}


def test_inplace_methods_and_views(sink: RecordingSink) -> None:
    model = models.InplaceOps()
    x = torch.randn(2, 4)
    expected = model(x)
    out, cap, _ = run(model, sink, x)
    assert_same(out, expected)
    h = model.fc(x)
    assert_same(cap["fc"], h)  # before h.add_(1)
    assert_same(cap["view"], h.view(2, -1))  # a view of h, also before add_
    assert_same(cap["sigmoid"], torch.sigmoid(h))  # before relu(inplace) and w += 3
    g = torch.relu(torch.sigmoid(h))
    assert_same(cap["relu"], g)  # before w += 3 writes into it through a slice
    assert_same(cap["getitem"], g[:, :2])


def test_encoder_block(sink: RecordingSink) -> None:
    model = models.Encoder().eval()
    x = torch.randn(2, 5, 4)
    expected, hooks = eager_with_hooks(model, x)
    out, cap, _ = run(model, sink, x)
    assert_same(out, expected)
    for path in (
        "embed",
        "layers.0.ln1",
        "layers.0.ln2",
        "layers.0.mlp.1",
        "layers.0.mlp",
        "layers.0",
        "layers.1",
        "attn",
        "norm",
    ):
        assert_same(cap[path], hooks.outputs[path][0])
    assert_same(cap["layers.0.getitem"], hooks.outputs["layers.0.attn"][0][0])
    assert_same(cap["layers.0.add"], hooks.inputs["layers.0.ln2"][0][0])
    # hand-written attention weights, computed step by step
    inner = hooks.inputs["attn"][0][0]
    q, k, _ = model.attn.qkv(inner).reshape(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    assert_same(cap["attn.softmax"], torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1))


def test_two_inputs_and_kwargs(sink: RecordingSink) -> None:
    model = models.TwoInputs()
    x, y, mask = torch.randn(2, 4), torch.randn(2, 3), torch.rand(2, 6)
    fm = ct.instrument(model, select=["a", "b", "add", "mul*"], sink=sink)
    for kwargs in ({}, {"scale": 2.0}, {"scale": 2.0, "mask": mask}):
        expected = model(x, y, **kwargs)
        out = fm(x, y, **kwargs)
        assert isinstance(out, tuple) and len(out) == 2
        for o, e in zip(out, expected, strict=True):
            assert_same(o, e)
        cap = sink.values()
        assert_same(cap["a"], model.a(x))
        assert_same(cap["add"], model.a(x) + model.b(y))
    assert len(sink.graphs) == 3  # each kwarg signature is its own trace
    assert "mask" in sink.graphs[2].names() and "mask" not in sink.graphs[1].names()
    assert "mul_1" in sink.graphs[2].names() and "mul_1" not in sink.graphs[0].names()


def test_dict_and_dataclass_outputs(sink: RecordingSink) -> None:
    model = models.DictOut()
    x = torch.randn(2, 4)
    out, cap, _ = run(model, sink, x)
    expected = model(x)
    assert type(out) is dict and list(out) == ["features", "logits"]
    for key in out:
        assert_same(out[key], expected[key])
    assert_same(cap["relu"], expected["features"])

    model2 = models.DataclassOut()
    out2, _, _ = run(model2, RecordingSink(), x)
    expected2 = model2(x)
    assert isinstance(out2, models.Out)
    assert_same(out2.logits, expected2.logits)
    assert_same(out2.hidden, expected2.hidden)


def test_export_fallback(sink: RecordingSink) -> None:
    model = models.ShapeBranch().eval()
    x = torch.randn(2, 4, 6, 6)
    g = ct.trace(model, x)
    assert g.trace_kind is TraceKind.TORCH_EXPORT
    assert "control flow" in str(g.meta_value("fx_error"))  # why fx gave up, first line
    expected, hooks = eager_with_hooks(model, x)
    out, cap, _ = run(model, sink, x)
    assert sink.graphs[0].trace_kind is TraceKind.TORCH_EXPORT
    assert_same(out, expected)
    for path in (
        "block.conv1",
        "block.bn1",
        "block.relu",
        "block.conv2",
        "block.bn2",
        "block",
        "fc",
    ):
        assert_same(cap[path], hooks.outputs[path][0])
    assert_same(cap["block.relu_1"], hooks.outputs["block.relu"][1])
    assert_same(cap["block.add"], hooks.inputs["block.relu"][1][0])
    assert (cap["block.add"] < 0).any()  # snapshot before the in-place relu
    assert_same(cap["max_pool2d"], torch.nn.functional.max_pool2d(hooks.outputs["block"][0], 2))


def test_export_fallback_train_mode_updates_stats_like_eager(sink: RecordingSink) -> None:
    model = models.ShapeBranch().train()
    reference = models.ShapeBranch().train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 4, 6, 6)
    fm = ct.instrument(model, select="block.bn*", sink=sink)
    out = fm(x)
    assert_same(out, reference(x))
    assert_same(model.block.bn1.running_var, reference.block.bn1.running_var)
    assert int(model.block.bn1.num_batches_tracked) == 1
    assert set(sink.values()) >= {"block.bn1", "block.bn2"}


def test_to_numpy_dtypes_exact() -> None:
    base = torch.randn(2, 3, 4, 5)
    cases = [
        base.to(torch.bfloat16), base.half(), base.double(), (base * 100).int(), base > 0,
        torch.tensor(3.5), base.transpose(1, 3), base.to(memory_format=torch.channels_last),
        base.to(torch.bfloat16).to(memory_format=torch.channels_last)[:, :, ::2],
        torch.arange(6, dtype=torch.int64), torch.complex(base, base),
    ]  # fmt: skip
    for t in cases:
        array = ct.to_numpy(t)
        assert array.shape == tuple(t.shape) and array.flags.c_contiguous
        if t.dtype is torch.bfloat16:
            assert str(array.dtype) == "bfloat16"
            np.testing.assert_array_equal(
                array.view(np.int16), t.contiguous().view(torch.int16).numpy()
            )
        else:
            np.testing.assert_array_equal(array, t.numpy())
            assert array.dtype == t.numpy().dtype
        before = array.copy()
        t.zero_() if t.dtype is not torch.bool else t.fill_(False)
        assert array.tobytes() == before.tobytes()  # a copy: later writes to t do not reach it


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_and_high_precision_models(sink: RecordingSink, dtype: torch.dtype) -> None:
    model = models.MLP().to(dtype)
    x = torch.randn(3, 8, dtype=dtype)
    out, cap, _ = run(model, sink, x, select="fc1")
    assert_same(out, model(x))
    expected = model.fc1(x)
    np.testing.assert_array_equal(cap["fc1"], ct.to_numpy(expected))


def test_export_fallback_kwargs_and_dict_output(sink: RecordingSink) -> None:
    model = models.ShapeBranchKwargs()
    x, bias = torch.randn(3, 4), torch.randn(4)
    fm = ct.instrument(model, select=["proj", "relu"], sink=sink)
    for double in (False, True):
        out = fm(x, double=double, bias=bias)
        expected = model(x, bias=bias, double=double)
        assert list(out) == ["h", "n"]
        for key in out:
            assert_same(out[key], expected[key])
        assert_same(sink.values()["relu"], torch.relu(model.proj(x) + bias))
    assert [g.trace_kind for g in sink.graphs] == [TraceKind.TORCH_EXPORT] * 2
