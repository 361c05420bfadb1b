"""``clouseau export-onnx``: build a model from a ``MODULE:ATTR`` spec and random inputs."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from clouseau.cli import args as types
from clouseau.cli.args import Exit

_EXPORT_HELP = """\
Export a model to ONNX with the selected activations as extra named outputs.

MODEL is a factory spec, MODULE:ATTR, where MODULE is an importable module
(mypkg.models) or a path to a Python file (models/resnet.py), and ATTR names
either a model object (a torch.nn.Module or an Equinox module) or a class or
function that builds one when called with no arguments.

Each --input gives the shape of one positional argument, as comma-separated
positive sizes with an optional dtype: 2,3,32,32 or 2,16:int64 (float32 by
default). The dtypes:
  {dtypes}.
Example inputs are random (normal for floats, 0..9 for ints) from --seed. The
directory of -o must exist.

  clouseau export-onnx mypkg.models:make_resnet --input 1,3,224,224 \\
      --select 'layer*.*.relu_1' -o resnet.onnx
"""


def add(sub: Any) -> None:
    """Register ``export-onnx`` on the subcommand parsers ``sub``."""
    ex = sub.add_parser("export-onnx", help="export a model to ONNX with activations as outputs",
                        description=_EXPORT_HELP.format(dtypes=", ".join(types.DTYPES)), formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ex.add_argument(
        "model", type=types.model_spec, metavar="MODEL", help="MODULE:ATTR factory spec (see above)"
    )
    ex.add_argument(
        "--input",
        action="append",
        type=types.input_spec,
        required=True,
        metavar="SHAPE[:DTYPE]",
        help="shape of one input (repeatable)",
    )
    ex.add_argument(
        "-o",
        "--output",
        type=types.onnx_output,
        default="model.onnx",
        help="the .onnx file (default model.onnx)",
    )
    ex.add_argument(
        "--select",
        action="append",
        type=types.glob,
        metavar="GLOB",
        help="activations to export as outputs (repeatable)",
    )
    ex.add_argument("--seed", type=types.seed, default=0, help="seed of the random example inputs")
    ex.set_defaults(run=run)


def run(args: argparse.Namespace, console: Console) -> int:
    """Run ``clouseau export-onnx``; the exit status."""
    from clouseau.api import export_onnx

    model = load_factory(args.model)
    example = make_inputs(model, list(args.input), args.seed)
    out = export_onnx(model, example, args.output, select=args.select)
    console.print(
        f"wrote {escape(str(out.path))}: inputs {', '.join(out.inputs)}; outputs {escape(', '.join(out.outputs))}"
    )
    return Exit.OK


def load_factory(spec: str) -> Any:
    """The model named by ``MODULE:ATTR``; a class or function there is called with no arguments."""
    import inspect

    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"MODEL {spec!r} must be MODULE:ATTR, e.g. mypkg.models:make_model or models.py:Net"
        )
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert loader_spec is not None and loader_spec.loader is not None
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[path.stem] = module
        loader_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            raise ValueError(
                f"cannot import {module_name!r} ({err}); run from the directory that holds it or give a .py path"
            ) from None
        finally:
            sys.path.pop(0)
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    return target() if inspect.isclass(target) or inspect.isfunction(target) else target


def make_inputs(model: Any, specs: list[tuple[tuple[int, ...], str]], seed: int) -> tuple[Any, ...]:
    """Random example inputs of the given shapes, as tensors of the model's framework."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        gen = torch.Generator().manual_seed(seed)
        out = []
        for shape, dtype in specs:
            tdtype = getattr(torch, dtype)
            if tdtype.is_floating_point:
                out.append(torch.randn(shape, generator=gen, dtype=tdtype))
            else:
                high = 2 if tdtype is torch.bool else 10
                out.append(torch.randint(0, high, shape, generator=gen, dtype=tdtype))
        return tuple(out)
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(seed), len(specs))
    return tuple(
        jax.random.normal(k, shape, jnp.dtype(dtype)) if jnp.issubdtype(jnp.dtype(dtype), jnp.floating)
        else jax.random.bernoulli(k, 0.5, shape) if dtype == "bool"
        else jax.random.randint(k, shape, 0, 10, jnp.dtype(dtype))
        for k, (shape, dtype) in zip(keys, specs, strict=True)
    )  # fmt: skip
