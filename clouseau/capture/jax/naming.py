"""How the JAX frontend names points, and how those names line up with PyTorch's.

Names
-----
- A module's output is named by its pytree path from the root model: attribute names and
  sequence/dict keys joined by dots (``layers.0``, ``blocks.3.attn``). The root has no
  name. A module called twice gets ``<path>_1`` for its second output.
- An operation is ``<module path>.<scopes>.<op>`` with a counter local to that prefix:
  ``layers.1.dot_general``, ``layers.1.add``, ``layers.1.add_1``. ``<scopes>`` are the
  user's ``jax.named_scope`` names inside that module. Operations at the root have no
  module prefix.
- ``op`` is the primitive (``dot_general``, ``conv_general_dilated``, ``add``), or the
  activation of :data:`ACTIVATIONS` that produced the value (``relu``, ``gelu``,
  ``softmax``: one node whose internals are hidden, even where JAX inlines them), or the
  name of a function JAX itself jitted (``clip``), or of a custom_jvp/custom_vjp function.
- A ``jax.jit``-ed function of the user's is a scope: its ops are
  ``<prefix>.<function>.<op>`` and its output is also called ``<prefix>.<function>``.
- ``lax.scan`` is a scope too: ``scan.<op>`` names a value of one iteration (saved with
  ``SavedValue.index == (i,)``), ``scan.carry``/``scan.x`` the carry and the slice an
  iteration receives, and ``scan`` (``scan:0``, ...) the scan's results.
- The model's array leaves are ``param`` nodes named by their pytree path
  (``layers.0.weight``); the example arguments are ``input`` nodes named by the
  parameter name (``x``, or ``batch.image`` for a pytree argument).

Key map to PyTorch
------------------
The same model written in PyTorch and in Equinox has the same module-output names,
except where the two libraries store children differently:

==========================  ====================  =======================
container                   PyTorch name          Equinox name
==========================  ====================  =======================
``Sequential``              ``0``, ``1``          ``layers.0``, ``layers.1``
``ModuleList`` / list       ``blocks.0``          ``blocks.0``
``ModuleDict`` / dict       ``heads.cls``         ``heads.cls``
activation as a module      ``act`` (``ReLU``)    ``act`` (``eqx.nn.Lambda(jax.nn.relu)``)
==========================  ====================  =======================

So ``{"layers.": ""}`` (:data:`TORCH_KEY_MAP`) maps the Equinox names of an
``eqx.nn.Sequential`` root to PyTorch's; a nested ``eqx.nn.Sequential`` at ``body`` maps
with ``{"body.layers.": "body."}``. A bare function field (``activation=jax.nn.relu``) is
no module: its output is the op ``relu`` of the module calling it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: ``jax.nn`` functions that become one named node each (``op == name``).
ACTIVATIONS: tuple[str, ...] = (
    "relu", "relu6", "gelu", "silu", "swish", "sigmoid", "softmax", "log_softmax", "tanh",
    "elu", "selu", "celu", "leaky_relu", "softplus", "soft_sign", "hard_tanh",
    "hard_sigmoid", "hard_silu", "hard_swish", "log_sigmoid", "glu", "mish", "squareplus",
    "sparse_plus", "standardize",
)  # fmt: skip

#: Equinox names -> PyTorch names for a model whose root is an ``eqx.nn.Sequential``.
TORCH_KEY_MAP: dict[str, str] = {"layers.": ""}

_BAD = re.compile(r"[^A-Za-z0-9_\-]+")


def clean(segment: str) -> str:
    """A name segment with characters that are not allowed in point names replaced."""
    cleaned = _BAD.sub("_", segment).strip("_")
    return cleaned or "fn"


def key_name(key: Any) -> str:
    """One pytree key (``GetAttrKey``, ``SequenceKey``, ``DictKey``, ...) as a name segment."""
    for attr in ("name", "idx", "key"):
        if hasattr(key, attr):
            return clean(str(getattr(key, attr)))
    return clean(str(key))


def path_name(keys: Iterable[Any]) -> str:
    """A pytree key path as a dotted name: ``(GetAttrKey('layers'), SequenceKey(0))`` -> ``layers.0``."""
    return ".".join(key_name(k) for k in keys)


def join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


class Namer:
    """Hands out unique point names: ``<prefix><base>``, then ``_1``, ``_2`` local to prefix."""

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._counts: dict[str, int] = {}

    def take(self, name: str) -> str:
        """``name`` itself if free, else ``name_1``, ``name_2``, ..."""
        count = self._counts.get(name, 0)
        candidate = name if count == 0 else f"{name}_{count}"
        while candidate in self._used:
            count += 1
            candidate = f"{name}_{count}"
        self._counts[name] = count + 1
        self._used.add(candidate)
        return candidate


def map_keys(name: str, key_map: dict[str, str]) -> str:
    """Rewrite a name with the first matching prefix of ``key_map`` (longest first)."""
    for src in sorted(key_map, key=len, reverse=True):
        if name.startswith(src):
            return key_map[src] + name[len(src) :]
        if src.endswith(".") and name == src[:-1]:
            return key_map[src].rstrip(".")
    return name
