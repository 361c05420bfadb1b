"""What goes into a sink comes back out of load(): dtypes, rolling files, calls, interop."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from clouseau.ir.errors import CaptureError
from clouseau.store import DirectorySink, MemorySink, load, open_sink
from clouseau.store.safetensors_io import read_header
from tests.store.util import capture_files, put_calls, read_all, same, small_graph, value

RNG = np.random.default_rng(0)


def _int_extremes(dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.array([info.min, -1 if info.min else 0, 0, 1, info.max], dtype=dtype)


SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25, 65504.0]
ARRAYS = {
    "bool": RNG.random((3, 5)) > 0.5,
    "int8": _int_extremes(np.int8),
    "uint8": _int_extremes(np.uint8),
    "int16": _int_extremes(np.int16),
    "uint16": _int_extremes(np.uint16),
    "int32": _int_extremes(np.int32),
    "uint32": _int_extremes(np.uint32),
    "int64": _int_extremes(np.int64),
    "uint64": _int_extremes(np.uint64),
    "float16": np.array(SPECIAL, dtype=np.float16),
    "bfloat16": np.array([*SPECIAL, 1e38, 1 / 3], dtype=ml_dtypes.bfloat16),
    "float8_e4m3fn": np.array([0.5, -448.0, 1.0], dtype=ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.array([0.5, -57344.0, np.inf], dtype=ml_dtypes.float8_e5m2),
    "float32": np.array([*SPECIAL, 1e-45, 3.4e38], dtype=np.float32),
    "float64": np.array([*SPECIAL, 5e-324, 1.7e308], dtype=np.float64),
    "complex64": np.array([1 + 2j, np.nan - 1j], dtype=np.complex64),
    "nan_payload": np.array([0x7FC00001, 0xFFC12345], dtype=np.uint32).view(np.float32),
    "scalar_0d": np.array(3.5, dtype=np.float32),
    "scalar_0d_bf16": np.array(-1.25, dtype=ml_dtypes.bfloat16),
    "empty": np.zeros((0,), dtype=np.float32),
    "empty_2d": np.zeros((4, 0, 3), dtype=np.int64),
    "non_contiguous": np.arange(60, dtype=np.float64).reshape(6, 10)[::2, ::-3],
    "transposed_bf16": np.arange(12, dtype=np.float32).reshape(3, 4).T.astype(ml_dtypes.bfloat16),
    "fortran": np.asfortranarray(RNG.standard_normal((4, 5)).astype(np.float32)),
    "big_endian": np.arange(5, dtype=">f4"),
    "big_3d": RNG.standard_normal((7, 11, 13)).astype(np.float32),
}


@pytest.mark.parametrize("sink_kind", ["directory", "memory"])
def test_every_dtype_round_trips_exactly(tmp_path: Path, sink_kind: str) -> None:
    sink = DirectorySink(tmp_path) if sink_kind == "directory" else MemorySink()
    put_calls(sink, [[value(name, array) for name, array in ARRAYS.items()]])
    cap = load(tmp_path) if sink_kind == "directory" and not sink.close() else sink.capture()
    assert cap.names() == tuple(ARRAYS)
    for name, array in ARRAYS.items():
        expected = array.astype(array.dtype.newbyteorder("<")) if name == "big_endian" else array
        assert same(cap[name], expected), name


def test_loaded_arrays_are_fresh_and_writable(tmp_path: Path) -> None:
    with_sink = DirectorySink(tmp_path)
    put_calls(with_sink, [[value("a", np.arange(4.0))]])
    with_sink.close()
    cap = load(tmp_path)
    first = cap["a"]
    first[0] = 99
    assert cap["a"][0] == 0  # read afresh each time, from the file


def test_memory_capture_is_read_only() -> None:
    sink = MemorySink()
    source = np.arange(4.0)
    put_calls(sink, [[value("a", source)]])
    with pytest.raises(ValueError, match="read-only"):
        sink.capture()["a"][0] = 5
    source[1] = 7  # the frontend's array stays writable


def test_files_roll_at_the_limit_and_every_call_loads_back(tmp_path: Path) -> None:
    max_size_mb = 0.02  # 20,971 bytes
    limit = int(max_size_mb * 2**20)
    calls = []
    for call in range(6):
        values = [
            value(f"p{i}", RNG.standard_normal(int(n)).astype(np.float32))
            for i, n in enumerate(RNG.integers(1, 2000, size=5))
        ]
        if call == 3:  # a lone array over the limit gets a file of its own
            values.insert(2, value("huge", np.arange(3 * limit // 8, dtype=np.float64)))
        calls.append(values)
    sink = DirectorySink(tmp_path, max_size_mb=max_size_mb)
    put_calls(sink, calls)
    sink.close()

    files = capture_files(tmp_path)
    assert len(files) > 3
    assert [f.name for f in files] == [
        f"activations-{i:03d}.safetensors" for i in range(len(files))
    ]
    for file in files:
        if file.stat().st_size > limit:
            assert list(read_all(file)) == ["huge#3"], "only a lone oversize array may exceed"
    cap = load(tmp_path)
    assert cap.calls == tuple(range(6))
    for call, values in enumerate(calls):
        got = [r for r in cap.records if r.call == call]
        assert [r.name for r in got] == [v.name for v in values]
        assert [r.order for r in got] == list(range(len(values)))
        for v in values:
            assert same(cap.get(v.name, call=call), v.array)


def test_the_size_bound_holds_for_escaped_names_and_small_arrays(tmp_path: Path) -> None:
    # With small arrays the header dominates: the writer must count it, escapes included.
    limit = 4096
    names = ['blocks.0.ätt"n\\x', "日本.relu", "plain", "a\tb"]
    sink = DirectorySink(tmp_path, max_size_mb=limit / 2**20)
    calls = [
        [value(f"{n}.{i}", np.full(i % 5, i, np.int8), (i % 3,)) for i, n in enumerate(names * 3)]
    ]
    put_calls(sink, calls * 20)
    sink.close()
    sizes = [f.stat().st_size for f in capture_files(tmp_path)]
    assert len(sizes) > 5 and max(sizes) <= limit
    assert min(sizes[:-1]) > limit * 0.8  # a tight bound, not a wild guess
    assert len(load(tmp_path).records) == 12 * 20


def test_three_calls_are_kept_apart(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path)
    graph_id = sink.add_graph(small_graph())
    put_calls(
        sink,
        [[value("relu", np.full((2, 3), c, np.float32), (), "act")] for c in range(3)],
        graph_id,
    )
    sink.close()
    cap = load(tmp_path)
    assert cap.calls == (0, 1, 2)
    assert cap.names() == ("relu", "act")
    for c in range(3):
        assert same(cap.get("relu", call=c), np.full((2, 3), c, np.float32))
        assert same(cap.get("act", call=c), np.full((2, 3), c, np.float32))
    assert [a[0, 0] for a in cap.all_calls("relu")] == [0, 1, 2]
    keys = [k for f in capture_files(tmp_path) for k in read_all(f)]
    assert keys == ["relu#0", "relu#1", "relu#2"]  # never concatenated


def test_file_metadata_follows_the_contract(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path)
    put_calls(sink, [[value("relu", np.ones(3), (), "act"), value("scan.body", np.ones(2), (4,))]])
    sink.close()
    (file,) = capture_files(tmp_path)
    metadata, entries = read_header(file)
    assert metadata["format"] == "clouseau.capture/1"
    # No call continues past this file, and none of an earlier file ended in it.
    assert (metadata["open"], metadata["done"]) == ("[]", "[]")
    assert json.loads(metadata["clouseau"]) == [
        ["relu#0", ["relu", "act"], "relu", 0, 0, 0, []],
        ["scan.body#0@4", ["scan.body"], "scan.body", 0, 1, 0, [4]],
    ]
    assert [e.key for e in entries] == ["relu#0", "scan.body#0@4"]
    status = json.loads((tmp_path / "status.json").read_text())
    assert status == {
        "format": "clouseau.capture/1",
        "calls": 1,
        "closed": True,
        "failed_calls": {},
        "lost_calls": {},
        "files": [file.name],
        "pattern": "activations-{idx:03d}.safetensors",
        "graphs": 0,
        "done": [],
        "pid": os.getpid(),
    }


def test_a_point_saved_twice_in_one_call_keeps_both(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path)
    put_calls(sink, [[value("x", np.zeros(2)), value("x", np.ones(2))]])
    sink.close()
    assert sorted(read_all(capture_files(tmp_path)[0])) == ["x#0", "x#0~1"]
    assert same(load(tmp_path)["x"], np.array([[0.0, 0.0], [1.0, 1.0]]))


def test_memory_and_directory_sinks_hold_the_same(tmp_path: Path) -> None:
    calls = [
        [value(name, array) for name, array in list(ARRAYS.items())[i::3]] for i in range(3)
    ] + [[value("loop", np.full(2, i), (i,)) for i in (2, 0, 1)]]
    memory, directory = MemorySink(), DirectorySink(tmp_path, max_size_mb=0.001)
    for sink in (memory, directory):
        sink.add_graph(small_graph())
        put_calls(sink, calls)
        sink.fail_call(1, RuntimeError("boom"))
        sink.close()
    a, b = memory.capture(), load(tmp_path)
    assert a.records == b.records
    assert a.names() == b.names()
    assert dict(a.failed_calls) == dict(b.failed_calls) == {1: "RuntimeError: boom"}
    assert a.graph == b.graph == small_graph()
    for r in a.records:
        assert same(
            a.get(r.name, call=r.call, index=r.index), b.get(r.name, call=r.call, index=r.index)
        )


def test_our_files_load_with_the_safetensors_package(tmp_path: Path) -> None:
    numpy_safetensors = pytest.importorskip("safetensors.numpy")
    safetensors = pytest.importorskip("safetensors")
    exotic = ("BF16", "F8_E4M3", "F8_E5M2")
    sink = DirectorySink(tmp_path)
    call = sink.begin_call()
    for is_exotic in (False, True):  # numpy-native dtypes in one file, the others in another
        sink.put(
            call,
            0,
            [
                value(k, a)
                for k, a in ARRAYS.items()
                if (a.dtype.type.__module__ == "ml_dtypes") == is_exotic
            ],
        )
        sink.flush()
    sink.close()
    loaded: dict[str, np.ndarray] = {}
    raw: dict[str, dict] = {}
    for file in capture_files(tmp_path):
        tensors = safetensors.deserialize(file.read_bytes())  # every dtype, as raw bytes
        raw.update(tensors)
        with safetensors.safe_open(file, framework="np") as f:
            assert f.metadata()["format"] == "clouseau.capture/1"
        # safetensors.numpy has no bf16/float8 (numpy lacks them); those are checked as bytes.
        if all(t["dtype"] not in exotic for _, t in tensors):
            loaded.update(numpy_safetensors.load_file(file))
    assert len(loaded) > len(ARRAYS) // 2
    for name, array in ARRAYS.items():
        stored = np.asarray(array, order="C")
        assert raw[f"{name}#0"]["shape"] == list(stored.shape)
        assert (
            bytes(raw[f"{name}#0"]["data"])
            == stored.astype(stored.dtype.newbyteorder("<")).tobytes()
        )
        if f"{name}#0" in loaded:
            assert np.array_equal(loaded[f"{name}#0"], array, equal_nan=array.dtype.kind in "fc")


def test_bf16_and_float8_written_by_safetensors_read_exactly(tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors")
    arrays = {k: ARRAYS[k] for k in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "scalar_0d_bf16")}
    specs = {
        k: safetensors.TensorSpec(
            dtype=a.dtype.name, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes
        )
        for k, a in arrays.items()
    }
    safetensors.serialize_file(specs, str(tmp_path / "theirs.safetensors"), metadata=None)
    got = read_all(tmp_path / "theirs.safetensors")
    for k, a in arrays.items():
        assert same(got[k], a), k


def test_files_of_the_safetensors_package_read_and_validate(tmp_path: Path) -> None:
    numpy_safetensors = pytest.importorskip("safetensors.numpy")
    plain = {
        "a": np.arange(12, dtype=np.int16).reshape(3, 4),
        "b": np.array(2.5),
        "c": np.zeros((0, 2), np.uint8),
        "d": RNG.random(7) > 0.5,
    }
    file = tmp_path / "theirs.safetensors"
    numpy_safetensors.save_file(plain, file, metadata={"who": "safetensors"})
    metadata, _ = read_header(file)
    assert metadata == {"who": "safetensors"}
    got = read_all(file)
    assert sorted(got) == sorted(plain)
    for k, a in plain.items():
        assert same(got[k], a)
    with pytest.raises(CaptureError, match="not a clouseau capture"):
        load(tmp_path)
    with pytest.raises(CaptureError, match="not written by clouseau"):
        load(file)


def test_new_capture_replaces_only_clouseaus_files(tmp_path: Path) -> None:
    numpy_safetensors = pytest.importorskip("safetensors.numpy")
    sink = DirectorySink(tmp_path, max_size_mb=0.001)
    sink.add_graph(small_graph())
    sink.add_graph(small_graph())
    put_calls(sink, [[value("a", np.zeros(300))] for _ in range(4)])
    sink.close()
    assert len(capture_files(tmp_path)) == 4
    (tmp_path / "notes.txt").write_text("mine")
    numpy_safetensors.save_file({"w": np.ones(2)}, tmp_path / "weights.safetensors")
    # A writer's leftover: its header names clouseau's format (or it is still empty).
    (tmp_path / ".activations-009.safetensors.k2j4_x9a.tmp").write_bytes(
        (capture_files(tmp_path)[0].read_bytes())[:100]
    )
    (tmp_path / ".graph-000.json.abcdefgh.tmp").write_bytes(b"")
    (tmp_path / ".other.1.tmp").write_bytes(b"not ours")
    (tmp_path / ".activations-009.safetensors.123.tmp").write_bytes(b"not ours either")

    sink = DirectorySink(tmp_path)
    put_calls(sink, [[value("b", np.ones(2))]])
    sink.close()
    # The old files, graphs and temporary file went; the user's files stayed.
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        ".activations-009.safetensors.123.tmp",
        ".clouseau.lock",
        ".other.1.tmp",
        "activations-000.safetensors",
        "notes.txt",
        "status.json",
        "weights.safetensors",
    ]
    cap = load(tmp_path)
    assert cap.names() == ("b",) and cap.graphs == ()


def test_capture_api(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path)
    graph_id = sink.add_graph(small_graph())
    c0 = sink.begin_call()
    sink.put(c0, graph_id, [value("fc", np.ones(2)), value("relu", np.ones(2), (), "act")])
    c1 = sink.begin_call()
    sink.put(c1, graph_id, [value("fc", np.zeros(2))])
    sink.put(c1, graph_id, [value("body", np.full(2, i), (i,)) for i in (2, 0, 1)])
    sink.put(
        c1,
        graph_id,
        [value("nest", np.full(3, 10 * i + j), (i, j)) for i in range(2) for j in range(3)],
    )
    sink.fail_call(c1, ValueError("bad input"))
    sink.close()

    cap = load(tmp_path)
    assert cap.names() == ("fc", "relu", "act", "body", "nest")
    assert list(cap) == list(cap.names()) and len(cap) == 5
    assert cap.calls == (0, 1)
    assert cap.failed_calls == {1: "ValueError: bad input"}
    assert cap.graph is not None and cap.graph.names() == small_graph().names()
    assert same(cap["relu"], np.ones(2)) and same(cap["act"], np.ones(2))
    assert same(cap.get("fc", call=1), np.zeros(2))
    assert cap.get("fc", call=7) is None and cap.get("fc", "dflt", call=7) == "dflt"
    assert cap.get("missing") is None and "missing" not in cap
    assert same(cap["body"], np.array([[0, 0], [1, 1], [2, 2]]))  # stacked in loop order
    assert same(cap.get("body", call=1, index=2), np.full(2, 2))
    assert same(cap.get("body", index=(1,)), np.full(2, 1))
    assert cap["nest"].shape == (2, 3, 3)  # one axis per nested loop
    assert cap["nest"][1, 2, 0] == 12
    with pytest.raises(KeyError, match="closest: fc"):
        cap["fcc"]

    # A name of several calls maps to its calls stacked along a new first axis.
    assert cap.calls_of("fc") == (0, 1) and cap.calls_of("relu") == (0,)
    assert same(cap["fc"], np.stack(cap.all_calls("fc"))) and same(cap.get("fc"), cap["fc"])
    assert same(cap["fc"][1], cap.get("fc", call=1))
    # So the Mapping protocol holds for a capture of several calls.
    assert list(dict(cap)) == list(cap.names()) == [k for k, _ in cap.items()]
    assert all(same(v, cap[k]) for k, v in zip(cap.keys(), cap.values(), strict=True))
    assert same(cap.get("body"), cap.get("body", call=1))
    assert repr(cap) == f"<Capture at {tmp_path}: 5 points, 2 call(s)>"
    # A single file of the capture loads on its own, with the directory's graph.
    single = load(capture_files(tmp_path)[0])
    assert single.calls == (0, 1) and single.graph is not None


def test_calls_of_different_shapes_do_not_stack(tmp_path: Path) -> None:
    from clouseau.ir.errors import ClouseauError
    from clouseau.store import AmbiguousPointError

    sink = DirectorySink(tmp_path)
    graph_id = sink.add_graph(small_graph())
    for size in (4, 4, 1):  # a last, smaller batch
        call = sink.begin_call()
        sink.put(call, graph_id, [value("fc", np.arange(size, dtype=np.float32))])
        sink.end_call(call)
    sink.close()
    cap = load(tmp_path)
    with pytest.raises(AmbiguousPointError) as info:
        cap["fc"]
    assert isinstance(info.value, KeyError) and isinstance(info.value, ClouseauError)
    assert str(info.value) == (
        "'fc' was captured in 3 calls (0, 1, 2) with different shapes ((1,), (4,)), which do "
        "not stack; pick one with cap.get('fc', call=k), or take them all with "
        "cap.all_calls('fc')"
    )
    assert [a.shape for a in cap.all_calls("fc")] == [(4,), (4,), (1,)]
    assert same(cap.get("fc", call=2), np.arange(1, dtype=np.float32))


def test_flush_makes_files_durable_and_capture_reads_them(tmp_path: Path) -> None:
    sink = open_sink(tmp_path, 1024, "run-{idx}.safetensors")
    put_calls(sink, [[value("a", np.arange(3))]])
    assert capture_files(tmp_path) == []  # still buffered
    sink.flush()
    assert [f.name for f in capture_files(tmp_path)] == ["run-0.safetensors"]
    put_calls(sink, [[value("a", np.arange(4))]])
    cap = sink.capture()
    assert cap.calls == (0, 1)
    sink.close()
    sink.close()  # closing twice is harmless
    with pytest.raises(CaptureError, match="closed"):
        sink.begin_call()
    with pytest.raises(CaptureError, match="closed"):
        sink.put(0, 0, [value("a", np.ones(1))])


def test_infinite_limit_never_rolls(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path, max_size_mb=math.inf)
    put_calls(sink, [[value("a", np.zeros(50_000))] for _ in range(5)])
    sink.close()
    assert len(capture_files(tmp_path)) == 1


def test_unstorable_dtype_is_refused_before_anything_is_buffered(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path)
    call = sink.begin_call()
    with pytest.raises(CaptureError, match="cannot store dtype complex128"):
        sink.put(call, 0, [value("ok", np.ones(2)), value("bad", np.ones(2, np.complex128))])
    with pytest.raises(CaptureError, match="cannot store dtype object"):
        MemorySink().put(0, 0, [value("bad", np.array([None]))])
    sink.put(call, 0, [value("ok", np.ones(2))])
    sink.close()
    assert [r.order for r in load(tmp_path).records] == [0]
