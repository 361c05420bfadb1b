"""The check both frontends make before tracing: does the model take these arguments?"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from clouseau.ir.errors import ArgumentError


def check_arguments(
    fn: Callable[..., Any],
    label: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    described: str,
) -> None:
    """Raise ArgumentError naming ``label``'s signature when ``fn`` cannot take the call.

    Without it, a wrong call fails deep inside a tracer with a misleading message.
    ``described`` is the frontend's short description of the arguments (shapes, dtypes).
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        bare = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        raise ArgumentError(
            f"{label}{bare} cannot take the arguments ({described}): {error}. Call the "
            "instrumented model as you would call the model itself."
        ) from None
