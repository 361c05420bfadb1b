"""``fmodel.generate(...)``: Hugging Face generation whose every forward step is captured.

``model.generate`` calls ``model(...)`` once per step: the prefill (the whole prompt),
then one decode step per new token, with the KV cache (``DynamicCache``) passed along.
While it runs, the model's ``forward`` is routed through the instrumented model, so each
step is one call of the capture, in order, and the tokens are the model's own. When the
selection picks module outputs only (:mod:`runtime.hooks`), forward hooks capture each step
with no trace at all. Otherwise steps of one structure (the decode steps all alike) share
one trace: the exported graph keeps the sequence and cache lengths dynamic. An
encoder-decoder's encoder run (generate runs it once, on its own) is call 0 either way:
hooked, or routed through an instrumented encoder sharing the sink, named as in the
whole model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import wraps
from typing import Any

import torch

from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import Graph
from clouseau.ir.selection import SelectLike, glob_matches, select_points

# Flags generate passes that change nothing when they equal the config's own value; left
# out of a step, they keep the step's inputs free of **kwargs, which torch.export cannot
# give dynamic sizes alongside a cache.
_FLAGS = {
    "return_dict": "use_return_dict",
    "output_attentions": "output_attentions",
    "output_hidden_states": "output_hidden_states",
}


def generate(fmodel: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Run ``fmodel.model.generate(*args, **kwargs)`` with every forward step captured."""
    model = fmodel.model
    if not callable(getattr(model, "generate", None)):
        raise AttributeError(
            f"{type(model).__name__} has no generate(): fmodel.generate needs a Hugging Face "
            "generation model (GenerationMixin), such as GPT2LMHeadModel"
        )
    hooks = fmodel._hook_capture()
    if hooks is not None:  # module outputs only: forward hooks, no trace
        with hooks.installed((model, *_encoder(model))):
            return model.generate(*args, **kwargs)
    own = model.__dict__.get("forward")
    config = getattr(model, "config", None)

    # generate reads forward's signature to choose what it passes (position_ids built
    # from the attention mask, logits_to_keep): the step keeps the model's own signature,
    # or a left-padded batch would run with default positions, silently other values.
    @wraps(model.forward)
    def step(*a: Any, **kw: Any) -> Any:
        # The instrumented model traces and runs with the model's own forward.
        _set_forward(model, own)
        try:
            return fmodel(*a, **_plain(kw, config))
        finally:
            model.forward = step

    model.forward = step
    try:
        with _encoder_routed(fmodel, model):
            return model.generate(*args, **kwargs)
    finally:
        _set_forward(model, own)


@contextmanager
def _encoder_routed(fmodel: Any, model: torch.nn.Module) -> Iterator[None]:
    """Route an encoder-decoder's encoder run through an instrumented encoder that shares
    ``fmodel``'s sink and selection: the run is a call of the capture (call 0), its points
    named as in the full model (``encoder.block.0...``), as the hook path names them."""
    found = _encoder(model)
    path = next((p for p, m in model.named_modules() if found and m is found[0]), "")
    if not path:
        yield
        return
    encoder, select, intervene = found[0], fmodel._select, fmodel._intervene
    # Each pattern may pick points of the encoder run only, or of the decoder steps only.
    lenient = _Lenient(select) if _picks(select) else select
    changes = {_Lenient(k): a for k, a in intervene.items()} if intervene else intervene
    sink = _CallCounter(fmodel._sink)
    # A fresh one per generate: the encoder runs once, so its trace is not reused.
    traced = type(fmodel)(_AtPath(path, encoder), lenient, sink, changes, fmodel._grads)
    own = encoder.__dict__.get("forward")
    config = getattr(encoder, "config", None)

    @wraps(encoder.forward)
    def run(*a: Any, **kw: Any) -> Any:
        _set_forward(encoder, own)
        begun = sink.begun
        try:
            out = traced(*a, **_plain(kw, config))
        finally:
            encoder.forward = run
        if sink.begun == begun:  # nothing selected here: still call 0, as on the hook path
            sink.end_call(sink.begin_call())
        return out

    encoder.forward, fmodel._select, fmodel._intervene = run, lenient, changes
    try:
        yield
    finally:
        _set_forward(encoder, own)
        fmodel._select, fmodel._intervene = select, intervene
        fmodel._traces += traced.traces
    for pattern in (lenient, *(changes or ())):
        if isinstance(pattern, _Lenient):
            pattern.check(model)


class _CallCounter:
    """``sink``, counting the calls begun through it."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink
        self.begun = 0

    def begin_call(self) -> int:
        self.begun += 1
        return self._sink.begin_call()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


class _Lenient:
    """``select`` where picking nothing in one graph is no error: a selection written for
    the whole model may pick points of the encoder only, or of the decoder steps only.
    :meth:`check` then raises, as a strict selection would, for a glob that matched no
    point of any graph."""

    def __init__(self, select: SelectLike) -> None:
        self.select = select
        self._globs = _positive_globs(select)
        self._met: set[str] = set()
        self._picked = False

    def for_graph(self, graph: Graph) -> SelectLike:
        self._met.update(g for g in self._globs if any(glob_matches(g, p) for p in graph.points))
        chosen = frozenset(select_points(graph, self.select, strict=False))
        self._picked = self._picked or bool(chosen)
        return (lambda point: point in chosen) if chosen else []

    def __repr__(self) -> str:
        return repr(self.select)

    def check(self, model: torch.nn.Module) -> None:
        missed = [g for g in self._globs if g not in self._met]
        if missed or not self._picked:
            what = f"glob {missed[0]!r}" if missed else f"select {self.select!r}"
            raise SelectionError(
                f"{what} matched no point of {type(model).__name__}'s encoder run or decoder "
                "steps; list every name with clouseau.trace(model, *args).names() (the "
                "encoder's with clouseau.trace(model.get_encoder(), *args), under 'encoder.')"
            )


def _picks(select: SelectLike) -> bool:
    """Whether ``select`` is meant to pick something (not None, not an empty list)."""
    empty = isinstance(select, Sequence) and not isinstance(select, str) and not select
    return select is not None and not empty


def _positive_globs(select: SelectLike) -> tuple[str, ...]:
    if isinstance(select, str):
        select = (select,)
    if not isinstance(select, Sequence):
        return ()
    return tuple(s for s in select if isinstance(s, str) and not s.startswith("!"))


class _AtPath(torch.nn.Module):
    """``module`` at ``path`` under an otherwise empty root, whose forward is the module's:
    traced from this root, its points have the full model's names."""

    def __init__(self, path: str, module: torch.nn.Module) -> None:
        super().__init__()
        parent: torch.nn.Module = self
        *heads, last = path.split(".")
        for head in heads:
            parent.add_module(head, torch.nn.Module())
            parent = getattr(parent, head)
        parent.add_module(last, module)
        self._path = path

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.get_submodule(self._path)(*args, **kwargs)


def _encoder(model: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """An encoder-decoder's encoder: generate runs it once on its own, as a call."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return ()
    encoder = model.get_encoder()
    return (encoder,) if isinstance(encoder, torch.nn.Module) else ()


def _set_forward(model: torch.nn.Module, own: Any) -> None:
    if own is None:
        model.__dict__.pop("forward", None)
    else:
        model.forward = own


def _plain(kwargs: dict[str, Any], config: Any) -> dict[str, Any]:
    return {
        k: v
        for k, v in kwargs.items()
        if not (k in _FLAGS and isinstance(v, bool) and v == getattr(config, _FLAGS[k], None))
    }
