"""Cache objects a call passes in and gets back, updated in place as in eager mode.

A Hugging Face model called with ``past_key_values=cache`` appends to ``cache`` and
returns that same object. The traced graph takes the cache's tensors and returns new
ones, which the output's tree spec rebuilds into a new cache object; this adapter copies
the new object's state into the one the caller passed and returns the caller's object, so
a loop that keeps its cache (and ``out.past_key_values is cache``) behaves as eagerly.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

from clouseau.capture.torch._compat import is_registered_node


def is_cache_object(value: Any) -> bool:
    """A registered pytree node that is a plain object (not a container or a dataclass)."""
    return (
        is_registered_node(value)
        and not isinstance(value, Mapping | tuple | list)
        and not dataclasses.is_dataclass(value)
    )


class CacheAdopter:
    """Remembers the cache objects of the current call (per thread) and adopts the outputs."""

    def __init__(self) -> None:
        self._local = threading.local()

    def remember(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._local.caches = [v for v in (*args, *kwargs.values()) if is_cache_object(v)]

    def adopt(self, out: Any) -> Any:
        caches = getattr(self._local, "caches", None)
        if not caches:
            return out
        self._local.caches = None
        pending = list(caches)
        if isinstance(out, Mapping):
            for key, value in list(out.items()):
                out[key] = _adopted(value, pending)  # type: ignore[index]
            return out
        if isinstance(out, tuple | list):
            items = [_adopted(v, pending) for v in out]
            return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
        return _adopted(out, pending)


def _adopted(value: Any, pending: list[Any]) -> Any:
    if not is_cache_object(value):
        return value
    for i, cache in enumerate(pending):
        if type(cache) is type(value):
            del pending[i]
            cache.__dict__.update(value.__dict__)
            return cache
    return value
