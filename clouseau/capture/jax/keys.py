"""The JAX frontend's vocabulary of equations: their keys and the primitive families.

Every walker of a traced jaxpr (:mod:`.build` building the IR, :mod:`.plan` placing the
saves, :mod:`.interpret` rerunning it, :mod:`.lower`) names equations with the
constructors of :mod:`clouseau.ir.keys`, re-exported here, and tells calls, control flow
and custom-derivative functions apart with the sets below. The ONNX exporter, which may
not import a frontend, walks with :mod:`clouseau.ir.keys` too.
"""

from __future__ import annotations

from clouseau.ir.keys import (
    ROOT,
    body_key,
    branch_key,
    branch_of,
    cond_key,
    const_key,
    count_key,
    enclosing,
    equation_key,
    index_key,
    input_key,
    is_inside,
    parse_key,
)

__all__ = [
    "CALLS",
    "CONTROL",
    "CUSTOM",
    "LOOPS",
    "REMAT",
    "ROOT",
    "body_key",
    "branch_key",
    "branch_of",
    "cond_key",
    "const_key",
    "count_key",
    "enclosing",
    "equation_key",
    "index_key",
    "input_key",
    "is_inside",
    "parse_key",
]

# A call of a jitted function: its jaxpr (params["jaxpr"]) is inlined where it is called.
CALLS = frozenset({"jit", "pjit"})
# jax.checkpoint / remat: the body (params["jaxpr"], an open jaxpr) runs where it is called.
REMAT = frozenset({"remat2", "checkpoint", "remat"})
# A custom_jvp / custom_vjp function: params["call_jaxpr"] computes its primal value.
CUSTOM = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})
# Control flow whose bodies run a number of times the graph does not show.
CONTROL = frozenset({"scan", "cond", "while"})
# The loops of CONTROL: a value inside one exists once per iteration.
LOOPS = frozenset({"scan", "while"})
