"""The in-memory sink builds its records when a capture is read: reads between puts, and the
stored form of each array, are those of a directory sink."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clouseau.ir.errors import CaptureError
from clouseau.ir.sink import Saves, whole_call
from clouseau.store import DirectorySink, MemorySink, load
from tests.store.util import value


def _calls(sink: MemorySink | DirectorySink, arrays: list[np.ndarray]) -> None:
    """Two calls: two values, then one with an alias and a loop index; a grad-like put
    into the first call after the second began."""
    first = sink.begin_call()
    sink.put(first, 0, [value("a", arrays[0]), value("b", arrays[1])])
    second = sink.begin_call()
    sink.put(second, 0, [value("a", arrays[2], (3,), "alias")])
    sink.put(first, 0, [value("late", arrays[3])])
    sink.end_call(second)
    sink.end_call(first)


def test_reads_between_puts_match_a_directory_sink(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(4)]
    memory = MemorySink()
    first = memory.begin_call()
    memory.put(first, 0, [value("x", arrays[0])])
    early = memory.capture()  # a read builds the records put so far ...
    assert [r.key for r in early.records] == ["x#0"]
    memory.put(first, 0, [value("y", arrays[1])])
    memory.end_call(first)
    later = memory.capture()  # ... and the next read adds the later ones, in order
    assert [(r.key, r.order) for r in later.records] == [("x#0", 0), ("y#0", 1)]
    np.testing.assert_array_equal(later["y"], arrays[1])

    memory, directory = MemorySink(), DirectorySink(tmp_path)
    _calls(memory, arrays)
    _calls(directory, arrays)
    directory.close()
    kept, written = memory.capture().records, load(tmp_path).records
    assert [(r.key, r.names, r.call, r.order, r.index) for r in kept] == [
        (r.key, r.names, r.call, r.order, r.index) for r in written
    ]


def test_arrays_are_stored_as_the_files_hold_them() -> None:
    base = np.arange(12, dtype=">f4").reshape(3, 4)  # big-endian, and a strided view of it
    sink = MemorySink()
    call = sink.begin_call()
    sink.put(call, 0, [value("big", base.copy()), value("strided", base.astype("<f4")[:, ::2])])
    cap = sink.capture()
    big, strided = cap["big"], cap["strided"]
    assert big.dtype == np.dtype("<f4") and strided.flags.c_contiguous
    np.testing.assert_array_equal(big, base)
    np.testing.assert_array_equal(strided, base[:, ::2])
    with pytest.raises(ValueError, match="read-only"):
        big[0, 0] = 1.0


def test_a_refused_put_saves_nothing_and_later_puts_keep_their_order() -> None:
    sink = MemorySink()
    call = sink.begin_call()
    sink.put(call, 0, [value("ok", np.ones(2, np.float32))])
    with pytest.raises(CaptureError, match="cannot store dtype complex128"):
        sink.put(call, 0, [value("fine", np.ones(2)), value("bad", np.ones(2, np.complex128))])
    sink.put(call, 0, [value("after", np.zeros(2, np.float32))])
    assert [(r.key, r.order) for r in sink.capture().records] == [("ok#0", 0), ("after#0", 1)]
    sink.close()
    with pytest.raises(CaptureError, match="closed"):
        sink.put(call, 0, [value("closed", np.ones(2, np.float32))])


def test_a_whole_call_at_once_is_begin_put_end(tmp_path: Path) -> None:
    """put_call (the hook path's one sink call per model call) numbers and keeps a call as
    begin_call, put and end_call do, beside calls made that way and a late put into an
    earlier call; the fallback of a sink with no put_call of its own says the same."""
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(3).astype(np.float32) for _ in range(4)]

    def calls(sink: MemorySink | DirectorySink) -> None:
        put_call = whole_call(sink)
        first = sink.begin_call()
        sink.put(first, 0, [value("a", arrays[0])])
        second = put_call(0, Saves((("b",), ("c", "alias")), ("b", "c")), (arrays[1], arrays[2]))
        assert second == first + 1
        sink.put(first, 0, [value("late", arrays[3])])  # a gradient tap's put, after
        sink.end_call(first)

    memory, directory = MemorySink(), DirectorySink(tmp_path)
    assert getattr(whole_call(memory), "__self__", None) is memory  # its own, bound
    calls(memory)
    calls(directory)
    directory.close()
    kept, written = memory.capture().records, load(tmp_path).records
    assert [(r.key, r.names, r.call, r.order) for r in kept] == [
        (r.key, r.names, r.call, r.order) for r in written
    ]
    assert [(r.key, r.order) for r in kept if r.call == 1] == [("b#1", 0), ("c#1", 1)]


def test_a_refused_whole_call_is_numbered_and_failed() -> None:
    sink, bad, ok = MemorySink(), Saves((("bad",),), ("bad",)), Saves((("ok",),), ("ok",))
    with pytest.raises(CaptureError, match="cannot store dtype complex128"):
        sink.put_call(0, bad, (np.ones(2, np.complex128),))
    with pytest.raises(ValueError, match="2 arrays for 1 saved values"):
        sink.put_call(0, ok, (np.ones(2, np.float32),) * 2)
    assert sink.put_call(0, ok, (np.ones(2, np.float32),)) == 2
    cap = sink.capture()
    assert [r.key for r in cap.records] == ["ok#2"]
    assert "complex128" in cap.failed_calls[0] and "ValueError" in cap.failed_calls[1]
    sink.close()
    with pytest.raises(CaptureError, match="closed"):
        sink.put_call(0, ok, (np.ones(2, np.float32),))
    assert sink.capture().calls_made == 3  # a closed capture numbers no call


def test_a_whole_call_goes_through_a_wrapper_or_subclass_own_begin_call() -> None:
    """whole_call takes a sink class's own put_call only: a subclass that counts its
    calls in begin_call, or a wrapper forwarding attributes, is called through it."""

    class Counting(MemorySink):
        begun = 0

        def begin_call(self) -> int:
            self.begun += 1
            return super().begin_call()

    class Wrapper:
        def __init__(self, sink: MemorySink) -> None:
            self.sink, self.begun = sink, 0

        def begin_call(self) -> int:
            self.begun += 1
            return self.sink.begin_call()

        def __getattr__(self, name: str) -> object:
            return getattr(self.sink, name)

    saves = Saves((("a",),), ("a",))
    for sink in (Counting(), Wrapper(MemorySink())):
        assert whole_call(sink)(0, saves, (np.ones(2, np.float32),)) == 0  # type: ignore[arg-type]
        assert sink.begun == 1
        assert [r.key for r in sink.capture().records] == ["a#0"]
