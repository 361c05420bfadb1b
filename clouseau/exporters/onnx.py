"""Export a model to ONNX with selected activations as extra named outputs.

``clouseau.export_onnx(model, (x,), "model.onnx", select="relu*")`` writes an ONNX model
whose outputs are the model's outputs followed by one output per selected point, named by
the point (``layer1.0.relu_1``). The public function asks the model's frontend to lower it
and hands the result here (exporters never import frontends): PyTorch models come as the
instrumented ``torch.fx.GraphModule`` and go through ``torch.onnx.export``; JAX functions
and Equinox modules come as a jaxpr and go through clouseau's own lowering (``onnx_jax.py``).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clouseau.exporters._compat import tree_leaves
from clouseau.ir.errors import ClouseauError, MissingExtraError
from clouseau.ir.graph import Graph, Node, NodeKind

OPSET = 18


class OnnxExportError(ClouseauError, RuntimeError):
    """The model could not be exported to ONNX; the message says why and what to change."""


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote.

    ``outputs`` lists the ONNX output names in order: the model's outputs (``output``,
    or ``output_0``, ``output_1``, ...) then ``points``, the selected point names.
    """

    path: Path
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    points: tuple[str, ...]
    graph: Graph


def export_lowered(
    lowered: Any,
    framework: str,
    output: str | os.PathLike[str],
    *,
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    opset: int = OPSET,
    check: bool = True,
) -> OnnxExport:
    """Write the ONNX model of a frontend's lowered computation (see ``clouseau.export_onnx``).

    Parameters
    ----------
    lowered
        What the frontend's ``lower(model, args, kwargs, select)`` returned: for
        ``framework="torch"`` a GraphModule returning ``(outputs, saves)`` with its IR,
        for ``"jax"`` the closed jaxpr, its IR and the slots of the saves.
    framework
        ``"torch"`` or ``"jax"``.
    output
        The ``.onnx`` file to write.
    model, args, kwargs
        The model and its example inputs.
    opset
        The ONNX opset (default 18).
    check
        Run ``onnx.checker`` on the written model.

    Returns
    -------
    OnnxExport
        The path, the input and output names, the exported point names and the IR graph.

    Raises
    ------
    OnnxExportError
        The exporter failed; for JAX, ``UnsupportedOpError`` names the node and primitive.
    """
    try:
        import onnx
    except ImportError:
        raise MissingExtraError("onnx", "onnx") from None
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    if framework == "torch":
        graph, points = _export_torch(lowered, model, args, kwargs, path, opset)
        proto = onnx.load(str(path))
    else:
        from clouseau.exporters.onnx_jax import export_jax

        proto, graph, points = export_jax(lowered, opset)
        onnx.save(proto, str(path))
    if check:
        try:
            onnx.checker.check_model(str(path), full_check=True)
        except onnx.checker.ValidationError as err:
            raise OnnxExportError(f"the exported model {path} fails onnx.checker: {err}") from err
    inputs = tuple(
        i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}
    )
    return OnnxExport(path, inputs, tuple(o.name for o in proto.graph.output), points, graph)


def _first_name(save: Node) -> str:
    return save.names[0]


def _export_torch(
    lowered: Any,
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    path: Path,
    opset: int,
) -> tuple[Graph, tuple[str, ...]]:
    import torch

    inputs = tuple(lowered.inputs(args, kwargs))
    # Inputs and parameters are not repeated as outputs (ONNX values have one name).
    keep = tuple(i for i, s in enumerate(lowered.saves) if not _is_leaf_value(lowered.graph, s))
    points = tuple(_first_name(lowered.saves[i]) for i in keep)
    n_saves = len(lowered.saves)
    with torch.no_grad():
        raw = lowered.module(*inputs)
    outs = raw[0] if n_saves else raw
    n_out = len(tree_leaves(outs))
    input_names = _input_names(lowered.graph, len(inputs))
    taken = set(points) | set(input_names)
    output_names = [_fresh("output" if n_out == 1 else f"output_{i}", taken) for i in range(n_out)]
    flat = _flat(lowered.module, n_saves, keep)
    modes = [(m, m.training) for m in model.modules()]
    names = dict(
        input_names=list(input_names), output_names=[*output_names, *points], opset_version=opset
    )
    try:
        try:
            # The TorchScript exporter first: it is fast (no torch.export, no decomposition)
            # and keeps our names on every output. torch.export's exporter is the fallback.
            # Not under no_grad: that switches nn.MultiheadAttention to its fused fast path,
            # which the TorchScript exporter cannot lower.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(flat, inputs, str(path), dynamo=False, **names)
        except Exception as first:
            try:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.onnx.export(flat, inputs, str(path), dynamo=True, verbose=False, **names)
            except Exception as err:
                raise OnnxExportError(
                    f"torch.onnx.export failed for {type(model).__name__}: TorchScript exporter: "
                    f"{type(first).__name__}: {first}; torch.export exporter: {type(err).__name__}: {err}"
                ) from err
    finally:
        # torch.onnx.export restores the wrapper's mode recursively, which would flip an
        # eval() model to train(): put every module back as it was.
        for module, training in modes:
            module.training = training
    return lowered.graph, points


def _input_names(graph: Graph, count: int) -> tuple[str, ...]:
    names = tuple(n.name for n in graph.nodes if n.kind is NodeKind.INPUT)
    return names if len(names) == count else tuple(f"input_{i}" for i in range(count))


def _fresh(name: str, taken: set[str]) -> str:
    base, i = name, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def _flat_module() -> type:
    import torch

    class Flat(torch.nn.Module):
        """The lowered module with one flat tuple of outputs: model outputs, then saves."""

        def __init__(self, module: torch.nn.Module, n_saves: int, keep: tuple[int, ...]) -> None:
            super().__init__()
            self.module = module
            self.n_saves = n_saves
            self.keep = keep

        def forward(self, *inputs: Any) -> tuple[Any, ...]:
            raw = self.module(*inputs)
            outs, saves = (raw[0], raw[1]) if self.n_saves else (raw, ())
            # A value returned twice (an output that is also saved) must be two ONNX values.
            leaves = [t.clone() for t in tree_leaves(outs)]
            return (*leaves, *(saves[i] for i in self.keep))

    return Flat


def _flat(module: Any, n_saves: int, keep: tuple[int, ...]) -> Any:
    return _flat_module()(module, n_saves, keep)


def _is_leaf_value(graph: Graph, save: Any) -> bool:
    return graph.node(save.inputs[0].node).kind in (NodeKind.INPUT, NodeKind.CONSTANT)
