"""``clouseau.backend``: a ``torch.compile`` backend that saves activations.

``torch.compile(model, backend=clouseau.backend(select="relu*", path=".clouseau"))``
instruments every graph Dynamo hands the backend with the same rewrite pass as
:func:`clouseau.instrument`, then compiles the instrumented graph with another backend
(Inductor by default, or ``"aot_eager"``, ``"eager"``), so the compiled model saves what
the eager one would. Each call of the compiled model is one call of the capture, the
runs of all its graphs (graph breaks and all) included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch.fx as fx

from clouseau.capture._session import CaptureSession
from clouseau.capture.torch._compat import lookup_backend
from clouseau.capture.torch.dynamic.regions import RegionCompiler
from clouseau.ir.actions import Action
from clouseau.ir.selection import SelectLike
from clouseau.ir.sink import Sink


class Backend(CaptureSession):
    """A ``torch.compile`` backend that saves the selected activations to a sink.

    Use it as a context manager (or call ``close()``) to flush the capture; ``captured``
    is what it saved so far and ``traces`` counts the graphs it compiled.
    """

    def __init__(
        self,
        select: SelectLike,
        sink: Sink,
        *,
        compiler: str | Callable[..., Any] = "inductor",
        intervene: Mapping[Any, Action] | None = None,
    ) -> None:
        self._sink = sink
        self._compiler = compiler
        inner = lookup_backend(compiler) if compiler != "eager" else None
        self._regions = RegionCompiler(select, sink, intervene=intervene, compiler=inner)

    @property
    def traces(self) -> int:
        return self._regions.traces

    def flush(self) -> None:
        self._regions.end_open()
        super().flush()

    def close(self) -> None:
        self._regions.end_open()
        super().close()

    @property
    def captured(self) -> Any:
        self._regions.end_open()
        return super().captured

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        return self._regions(gm, example_inputs)

    def __repr__(self) -> str:
        return f"clouseau.backend(compiler={self._compiler!r})"
