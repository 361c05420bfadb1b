"""Equation keys: where a node's value is computed in a program of nested programs.

``Node.key`` names the place in the traced program that computes a node. In a graph
traced from a program of nested programs (a jaxpr, whose ``jit``, ``scan``, ``cond`` and
``while`` equations hold sub-jaxprs) it is a path of ``/``-separated steps from the
top-level program into the nested ones; a torch graph's key is the fx node's name, one
step with no ``/``:

==================  ==============================================================
step                what it names
==================  ==============================================================
``5``               equation 5 of the enclosing program
``c2``              constant 2 of the enclosing program (``"c2"`` at the top)
``in1``             input 1 of the enclosing program (a scan carry or slice)
``b1``              branch 1 of the ``cond`` equation before it (``"3/b1/0"``)
``body``            the body of the ``while`` equation before it (``"3/body/2"``)
``cond``            the condition of the ``while`` equation before it
``index``           the branch index of the ``cond`` before it (last step only)
``count``           the trip count of the ``while`` before it (last step only)
==================  ==============================================================

``"3/0/5"`` is equation 5 of the sub-program of equation 0 of the sub-program of equation
3. The frontend that builds the graph, its lowering and the exporters that rebuild the
program elsewhere all walk the program with these constructors, so a key computed by
one is found by the others. The grammar is plain strings: it imports no framework.
"""

from __future__ import annotations

import re

ROOT = ""  # the key of the top-level program (the scope of its equations)

_STEP = re.compile(r"(?:0|[1-9][0-9]*)|(?:c|in|b)(?:0|[1-9][0-9]*)|body|cond|index|count")
_LAST_ONLY = frozenset({"index", "count"})


def _child(scope: str, step: str) -> str:
    return f"{scope}/{step}" if scope else step


def equation_key(scope: str, position: int) -> str:
    """The key of equation ``position`` of the program at ``scope`` (``ROOT`` at the top)."""
    return _child(scope, str(position))


def const_key(scope: str, index: int) -> str:
    """The key of constant ``index`` of the program at ``scope``."""
    return _child(scope, f"c{index}")


def input_key(scope: str, index: int) -> str:
    """The key of input ``index`` of the program at ``scope``."""
    return _child(scope, f"in{index}")


def branch_key(cond: str, branch: int) -> str:
    """The scope of branch ``branch`` of the cond equation at ``cond``."""
    return f"{cond}/b{branch}"


def body_key(loop: str) -> str:
    """The scope of the body of the while equation at ``loop``."""
    return f"{loop}/body"


def cond_key(loop: str) -> str:
    """The scope of the condition of the while equation at ``loop``."""
    return f"{loop}/cond"


def index_key(cond: str) -> str:
    """The key of the branch index the cond equation at ``cond`` took."""
    return f"{cond}/index"


def count_key(loop: str) -> str:
    """The key of the trip count of the while equation at ``loop``."""
    return f"{loop}/count"


def parse_key(key: str) -> tuple[str, ...]:
    """The steps of ``key``, checked against the grammar of the module docs.

    Raises
    ------
    ValueError
        ``key`` is empty, has an empty step, or a step the grammar does not have (the
        message names it).
    """
    steps = tuple(key.split("/"))
    for position, step in enumerate(steps):
        if not _STEP.fullmatch(step):
            raise ValueError(
                f"{key!r} is not an equation key: step {step!r} is none of <n>, c<n>, "
                "in<n>, b<n>, body, cond, index, count"
            )
        if step in _LAST_ONLY and position != len(steps) - 1:
            raise ValueError(f"{key!r} is not an equation key: {step!r} must be its last step")
    return steps


def enclosing(key: str) -> list[str]:
    """The keys around ``key``, outermost first (``"3/b1/0"``: ``["3", "3/b1"]``)."""
    parts = key.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def is_inside(key: str, outer: str) -> bool:
    """``key`` is strictly inside the equation (or scope) at ``outer``."""
    return key.startswith(outer + "/")


def branch_of(key: str, cond: str) -> int:
    """The branch of the cond equation at ``cond`` that ``key`` is in."""
    if not is_inside(key, cond):
        raise ValueError(f"{key!r} is not inside the cond at {cond!r}")
    step = key[len(cond) + 1 :].split("/")[0]
    if not re.fullmatch(r"b(?:0|[1-9][0-9]*)", step):
        raise ValueError(f"{key!r} is not in a branch of the cond at {cond!r}")
    return int(step[1:])
