"""What both sinks share (call numbering, dtype checks) and the in-memory sink."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph, Node, NodeKind, TensorSpec
from clouseau.ir.sink import SavedBatch, SavedValue, Saves
from clouseau.store.capture import Capture, Entry, Record, tensor_key
from clouseau.store.safetensors_io import TO_NUMPY, dtype_code, storable

_STORABLE = frozenset(dtype.name for dtype in TO_NUMPY.values())


class Calls:
    """Call numbering and per-call order, shared by both sinks. Callers hold the lock."""

    def __init__(self, lock: threading.Lock | None = None) -> None:
        # Re-entrant unless the sink's methods never take it twice (a Lock costs less).
        self.lock: Any = lock if lock is not None else threading.RLock()
        self.graphs: list[Graph] = []
        self.next_call = 0
        self.order: dict[int, int] = {}
        self.failed: dict[int, str] = {}
        self.closed = False
        self.stopped = ""  # why the capture stopped early (a write error), "" if it did not

    def begin(self) -> int:
        if self.stopped or self.closed:  # the check is a call only where it raises
            self.check_open()
        call = self.next_call
        self.next_call = call + 1
        return call  # no order entry yet (order.get(call, 0)): a call that puts nothing adds none

    def records(
        self, call: int, graph_id: int, values: Sequence[SavedValue]
    ) -> list[tuple[Record, np.ndarray]]:
        self.check_open()
        names, nodes, raw, indices = columns(values)
        arrays = [np.asarray(array) for array in raw]
        for value_names, array in zip(names, arrays, strict=True):
            _refuse_dtype(value_names[0], array.dtype)  # before anything is numbered
        out = []
        for position, array in enumerate(arrays):
            order = self.order.get(call, 0)
            self.order[call] = order + 1
            value_names, index = tuple(names[position]), _index(indices, position)
            key = tensor_key(value_names[0], call, index)
            record = Record(key, value_names, nodes[position], call, order, graph_id, index)
            out.append((record, array))
        return out

    def check_open(self) -> None:
        if self.stopped:
            raise CaptureError(self.stopped)
        if self.closed:
            raise CaptureError(
                "this capture is closed: create a new instrumented model to capture again"
            )


# Per value of a put: its names, node, array and loop index (None: () for every value).
Columns = tuple[
    Sequence[Sequence[str]], Sequence[str], tuple[Any, ...], Sequence[Sequence[int]] | None
]


def columns(values: Sequence[SavedValue]) -> Columns:
    """The names, nodes, arrays and indices of a put, each as one sequence: a
    :class:`SavedBatch`'s own (nothing made per value), or gathered from the values."""
    if type(values) is SavedBatch:
        arrays = values.arrays
        return values.saves.names, values.saves.nodes, tuple(arrays), None
    return (
        tuple(v.names for v in values),
        tuple(v.node for v in values),
        tuple(v.array for v in values),
        tuple(v.index for v in values),
    )


def _index(indices: Sequence[Sequence[int]] | None, position: int) -> tuple[int, ...]:
    return () if indices is None else tuple(int(i) for i in indices[position])


def check_saved_dtypes(graph: Graph) -> None:
    """Refuse, at trace time, a graph that saves a value no safetensors file can hold."""
    for node in _saves(graph):
        spec = node.inputs and _spec_of(graph, node)
        if isinstance(spec, TensorSpec) and spec.dtype.value not in _STORABLE:
            name = node.names[0] if node.names else node.name
            _refuse_dtype(name, np.dtype(spec.dtype.value))


def _saves(graph: Graph) -> Iterator[Node]:
    for node in graph.nodes:
        if node.kind in (NodeKind.SAVE, NodeKind.SAVE_GRAD):
            yield node
        for sub in node.subgraphs:
            yield from _saves(sub)


def _spec_of(graph: Graph, save: Node) -> object:
    ref = save.inputs[0]
    found = _find(graph, ref.node)
    if found is None or ref.index >= len(found.outputs):
        return None
    return found.outputs[ref.index]


def _find(graph: Graph, name: str) -> object:
    for node in graph.nodes:
        if node.name == name:
            return node
        for sub in node.subgraphs:
            hit = _find(sub, name)
            if hit is not None:
                return hit
    return None


def _refuse_dtype(name: str, dtype: np.dtype) -> None:
    try:
        dtype_code(dtype)
    except CaptureError as err:
        raise CaptureError(
            f"point {name!r}: {err}. Leave it out with select=[..., '!{name}'], or cast it "
            "in the model"
        ) from None


class MemorySink:
    """Keeps everything in memory (``instrument(..., path=None)``).

    Arrays are stored as the files would hold them (little-endian, C-contiguous) and handed
    out read-only, so that reading a capture never changes it.

    Cost: ``put`` runs inside every call of the model, so it only checks the dtypes,
    numbers the values and keeps the put's names, nodes, arrays (the frontend's own
    copies) and indices as plain tuples, which the garbage collector stops tracking; a
    :class:`~clouseau.ir.sink.SavedBatch` hands over its names as tuples made once per
    graph, so nothing is made per value; ``put_call`` (the hook path's whole call) takes
    the lock once and keeps no order entry. The records and read-only views are made once,
    when a capture is next read.
    """

    def __init__(self) -> None:
        self._calls = Calls(threading.Lock())  # no method here takes it twice
        self._items: list[tuple[Record, np.ndarray]] = []
        # Per put not read yet (_Put).
        self._pending: list[_Put] = []

    def add_graph(self, graph: Graph) -> int:
        check_saved_dtypes(graph)
        with self._calls.lock:
            self._calls.graphs.append(graph)
            return len(self._calls.graphs) - 1

    def begin_call(self) -> int:
        calls = self._calls
        with calls.lock:
            return calls.begin()

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        # Plain tuples of strings and arrays, not SavedValue objects: the garbage
        # collector stops tracking them, so a long capture does not make every
        # collection (and so every call) slower. A SavedBatch's names are its Saves' own
        # tuples, shared by every call of the graph.
        if type(values) is SavedBatch:  # the per-call path: no frame, nothing per value
            names, nodes, indices = values.saves.names, values.saves.nodes, None
            arrays = values.arrays
        else:
            names, nodes, arrays, indices = columns(values)
        arrays = _storable(names, arrays)  # the caller's own arrays: outside the lock
        # Under the lock: a call's puts may come from another thread than its forward's
        # (autograd's device threads run the gradient taps, after the call has ended).
        calls = self._calls
        with calls.lock:
            if calls.stopped or calls.closed:
                calls.check_open()
            order = calls.order.get(call, 0)
            calls.order[call] = order + len(arrays)
            self._pending.append((call, graph_id, order, names, nodes, arrays, indices))

    def put_call(self, graph_id: int, saves: Saves, arrays: tuple[Any, ...]) -> int:
        """A whole call at once (:func:`~clouseau.ir.sink.whole_call`: the hook path):
        numbered and put under one hold of the lock, and no order entry kept for it, as
        nothing puts into it later (a call with gradient taps is begun, then put)."""
        names, nodes = saves.names, saves.nodes
        try:
            if len(arrays) != len(nodes):
                raise ValueError(f"{len(arrays)} arrays for {len(nodes)} saved values")
            arrays = _storable(names, arrays)
        except BaseException as error:  # refused: the call is numbered, and failed
            self.fail_call(self.begin_call(), error)
            raise
        calls = self._calls
        with calls.lock:
            call = calls.begin()  # a closed capture raises: no call numbered
            self._pending.append((call, graph_id, 0, names, nodes, arrays, None))
        return call

    def end_call(self, call: int) -> None:
        pass  # a call's order entry stays: its gradient taps may put after it ends

    def fail_call(self, call: int, error: BaseException) -> None:
        with self._calls.lock:
            self._calls.failed[call] = describe(error)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        with self._calls.lock:
            self._calls.closed = True

    def capture(self) -> Capture:
        with self._calls.lock:
            self._records()
            entries = tuple(Entry(r, _loader(a)) for r, a in self._items)
            return Capture(
                entries,
                tuple(self._calls.graphs),
                self._calls.failed,
                calls_made=self._calls.next_call,
                closed=self._calls.closed,
            )

    def _records(self) -> None:
        """The records of the values put since the last read, in the order they came, and
        their arrays as the files would hold them, read-only."""
        items = self._items
        for call, graph_id, order, names, nodes, arrays, indices in self._pending:
            for position, array in enumerate(arrays):
                value_names, index = tuple(names[position]), _index(indices, position)
                key = tensor_key(value_names[0], call, index)
                node = nodes[position]
                record = Record(key, value_names, node, call, order + position, graph_id, index)
                view = storable(array).view()
                view.flags.writeable = False
                items.append((record, view))
        self._pending.clear()


# (call, graph id, order of its first value, then the put's columns: names, nodes,
# arrays and indices).
_Put = tuple[
    int,
    int,
    int,
    Sequence[Sequence[str]],
    Sequence[str],
    tuple[np.ndarray, ...],
    Sequence[Sequence[int]] | None,
]
_NATIVE = frozenset(TO_NUMPY.values())  # the dtypes a file holds as they are


def _storable(names: Sequence[Sequence[str]], arrays: tuple[Any, ...]) -> tuple[Any, ...]:
    """``arrays`` as they are where each is a numpy array of a dtype a file holds (the
    frontends' host copies), else converted (:func:`_converted`)."""
    for array in arrays:
        if type(array) is not np.ndarray or array.dtype not in _NATIVE:
            return _converted(names, arrays)
    return arrays


def _converted(names: Sequence[Sequence[str]], arrays: tuple[Any, ...]) -> tuple[np.ndarray, ...]:
    """The arrays of a put as numpy arrays (converted once, and kept converted); a dtype
    no file can hold is refused before anything of the put is numbered."""
    out = tuple(np.asarray(array) for array in arrays)
    for value_names, array in zip(names, out, strict=True):
        if array.dtype not in _NATIVE:
            _refuse_dtype(value_names[0], array.dtype)
    return out


def _loader(array: np.ndarray) -> Callable[[], np.ndarray]:
    return lambda: array


def describe(error: BaseException) -> str:
    """``Type: message`` of an exception, as failed_calls records it."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
