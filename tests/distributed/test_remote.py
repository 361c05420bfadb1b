"""fsspec destinations: a local S3-compatible server (moto, on 127.0.0.1) and file:// URLs."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import clouseau
from clouseau.capture import torch as torch_frontend
from clouseau.distributed import Group, open_sink
from tests.distributed import workload

fsspec = pytest.importorskip("fsspec")
pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def s3_endpoint():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{server._server.server_port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_endpoint, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    conf = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    monkeypatch.setitem(fsspec.config.conf, "s3", conf)
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **conf)
    if not fs.exists("clouseau-test"):
        fs.mkdir("clouseau-test")
    return fs


def _capture(path, **options) -> clouseau.Capture:
    fmodel = clouseau.instrument(workload.model(), select=workload.SELECT, path=path, **options)
    with torch.no_grad(), fmodel:
        for batch in workload.batches():
            fmodel(batch)
    return fmodel.captured


def _assert_same(a: clouseau.Capture, b: clouseau.Capture) -> None:
    assert a.names() == b.names() and a.calls == b.calls
    for name in a.names():
        for x, y in zip(a.all_calls(name), b.all_calls(name), strict=True):
            np.testing.assert_array_equal(x, y)


def test_s3_capture_equals_the_disk_capture(tmp_path, bucket) -> None:
    after_close = _capture("s3://clouseau-test/run", max_size_mb=0.001)
    on_disk = _capture(tmp_path / "disk", max_size_mb=0.001)
    _assert_same(clouseau.load("s3://clouseau-test/run"), on_disk)
    _assert_same(after_close, on_disk)
    listed = {p.rsplit("/", 1)[-1] for p in bucket.ls("clouseau-test/run")}
    assert "status.json" in listed and not any(n.startswith(".") for n in listed)
    for call, eager in enumerate(workload.eager_points()):
        np.testing.assert_allclose(on_disk.get("fc1", call=call), eager["fc1"].numpy(), rtol=1e-6)


def test_a_second_capture_replaces_the_first(bucket) -> None:
    _capture("s3://clouseau-test/again", max_size_mb=0.001)
    fmodel = clouseau.instrument(workload.model(), select="fc1", path="s3://clouseau-test/again")
    with torch.no_grad(), fmodel:
        fmodel(workload.batches()[0])
    cap = clouseau.load("s3://clouseau-test/again")
    assert cap.calls == (0,) and cap.names() == ("fc1",)


def test_file_url_capture_equals_the_disk_capture(tmp_path) -> None:
    _capture(f"file://{tmp_path}/remote", max_size_mb=0.001)
    _assert_same(clouseau.load(f"file://{tmp_path}/remote"), clouseau.load(tmp_path / "remote"))
    assert not list((tmp_path / "remote").glob(".*.tmp"))


def test_parts_uploaded_to_s3_load_as_one(bucket) -> None:
    url = "s3://clouseau-test/parts"
    summaries = {}

    def gather_for(rank: int):
        def gather(summary: object) -> list[object]:
            summaries[rank] = summary
            return [summaries.get(0), summaries.get(1)]

        return gather

    for rank in (1, 0):  # rank 0 last: it writes the manifest from both summaries
        sink = open_sink(url, group=Group("test", rank, 2, gather_for(rank)))
        fmodel = torch_frontend.instrument(workload.model(), select=workload.SELECT, sink=sink)
        with torch.no_grad(), fmodel:
            for batch in workload.batches()[rank::2]:
                fmodel(batch)
    cap = clouseau.load(url)
    assert cap.world_size == 2 and cap.missing_ranks == ()
    assert cap.calls == tuple(range(workload.BATCHES))
    for call, eager in enumerate(workload.eager_points()):
        np.testing.assert_allclose(cap.get("act", call=call), eager["act"].numpy(), rtol=1e-6)


def test_an_unknown_protocol_is_a_clear_error() -> None:
    with pytest.raises(
        clouseau.CaptureError, match="cannot use nosuchfs://bucket/run: Protocol not known"
    ):
        clouseau.instrument(workload.model(), select="fc1", path="nosuchfs://bucket/run")
