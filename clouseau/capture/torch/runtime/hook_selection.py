"""Which module paths a selection hooks: the module outputs :class:`ModuleHooks`
(:mod:`~clouseau.capture.torch.runtime.hooks`) saves, decided once per instrumented model."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

import torch

from clouseau.ir.selection import SelectLike

_WILD = re.compile(r"[*?\[]")
_REPEAT = re.compile(r"_[0-9]+$")


def module_paths_selected(
    model: torch.nn.Module, select: SelectLike, *, dotless: bool = False
) -> tuple[str, ...] | None:
    """The module paths whose outputs ``select`` may pick, or None if it may pick others.

    Only globs are judged (a callable or a Selector may pick anything): each positive glob
    must have a last component without wildcards and name a module of ``model`` once a
    ``:<element>`` and a ``_<k>`` repeat suffix are set aside. An op is named ``<module
    path>.<op>`` and a module path is never an op's name, so such a glob matches module
    outputs only; a glob with wildcards could also reach ``<other path>.<op>``, so its
    last component must not be the name of a torch function or operator (``"blocks.*.relu"``
    is traced). A dotless glob matches the last component of a name or an op
    (``"relu*"``), and is judged only with ``dotless`` (a model no tracer traces, whose
    graph of ops is lost anyway): without wildcards and not an op's name (``"rpn"``, not
    ``"relu"``) it names the modules of that last component only.
    """
    if isinstance(select, str):
        select = (select,)
    if not isinstance(select, Sequence) or not all(isinstance(s, str) for s in select):
        return None
    positive = [s for s in select if not s.startswith("!")]
    if not positive:
        return None
    paths = [p for p, _ in model.named_modules() if p]
    found: dict[str, None] = {}
    for glob in positive:
        base = glob.split(":", 1)[0]
        last = base.rsplit(".", 1)[-1]
        bare = "." not in base
        if _WILD.search(last) or (bare and not dotless):
            return None
        if (_WILD.search(base) or bare) and _is_op_name(_REPEAT.sub("", last)):
            return None
        stripped = _REPEAT.sub("", base)
        # A dotless glob names a module by its last component, at any depth.
        names = {p: p.rsplit(".", 1)[-1] if bare else p for p in paths}
        hits = [
            p
            for p, name in names.items()
            if fnmatch.fnmatchcase(name, base) or fnmatch.fnmatchcase(name, stripped)
        ]
        if not hits:
            return None
        found.update(dict.fromkeys(hits))
    return tuple(found)


def hooked_paths(model: torch.nn.Module, select: SelectLike) -> tuple[str, ...] | None:
    """The module paths whose output some positive glob of ``select`` may name (``<path>``,
    ``<path>_<k>``, ``<path>:<element>``); None (every module) for a callable or Selector.

    Each hooked module is a graph break in the dynamic tier: the fewer, the larger its
    regions.
    """
    if isinstance(select, str):
        select = (select,)
    if not isinstance(select, Sequence) or not all(isinstance(s, str) for s in select):
        return None
    bases = [s.split(":", 1)[0] for s in select if not s.startswith("!")]
    globs = {g for base in bases for g in (base, _REPEAT.sub("", base))}
    return tuple(
        p for p, _ in model.named_modules() if p and any(fnmatch.fnmatchcase(p, g) for g in globs)
    )


def _is_op_name(name: str) -> bool:
    import builtins
    import operator

    import torch.nn.functional as F

    spaces = (torch, F, torch.Tensor, torch.ops.aten, operator, builtins)
    return any(hasattr(space, name) or hasattr(space, name + "_") for space in spaces)
