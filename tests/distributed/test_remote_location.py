"""fsspec URLs through the location layer, on a real S3-compatible server (moto on
127.0.0.1): only the files an earlier capture lists are replaced, and only once the new
run has traced; one writer per URL; an exit without close() uploads everything; an
endpoint that stops answering is an error after the timeout, naming the local copy;
``record`` writes to URLs as ``instrument`` does (issue 26, items 4-6, 8, 16, 20, 23)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import clouseau
from clouseau.store.safetensors_io import write_file
from tests.distributed import workload
from tests.distributed.launch import ROOT, env

fsspec = pytest.importorskip("fsspec")
pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

BUCKET = "clouseau-loc"


class FreezableProxy:
    """A TCP proxy to ``target`` that can stop answering (an endpoint that hangs)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.frozen = target, threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                while self.frozen.is_set() and not self.stopped.is_set():
                    time.sleep(0.05)  # holds the bytes: the endpoint stopped answering
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                s.close()

    def stop(self) -> None:
        self.stopped.set()
        self.server.close()


@pytest.fixture(scope="module")
def moto():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield server._server.server_port
    finally:
        server.stop()


def _configure(monkeypatch, endpoint: str) -> dict[str, str]:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    conf = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    monkeypatch.setitem(fsspec.config.conf, "s3", conf)
    return conf


@pytest.fixture
def s3(moto, monkeypatch):
    conf = _configure(monkeypatch, f"http://127.0.0.1:{moto}")
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **conf)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return fs


@pytest.fixture
def staging(tmp_path, monkeypatch):
    """Where staging directories go, to see that none is left behind."""
    where = tmp_path / "staging"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return Staging(where)


class Staging:
    """The staging directories of uploads under ``root`` (downloads for load are others)."""

    def __init__(self, root) -> None:
        self.root = root

    def iterdir(self):
        return iter(sorted(self.root.glob("clouseau-upload-*")))


def _run(path, select=workload.SELECT, calls=None, **options):
    fmodel = clouseau.instrument(workload.model(), select=select, path=path, **options)
    with torch.no_grad(), fmodel:
        for batch in calls or workload.batches():
            fmodel(batch)
    return fmodel


def test_only_listed_files_are_replaced_and_only_after_the_trace(s3, staging, tmp_path) -> None:
    url = f"s3://{BUCKET}/owned"
    weights = tmp_path / "model.safetensors"  # the user's weights (not clouseau's format)
    write_file(weights, [("w", np.arange(4.0))], {"owner": "me"})
    s3.put_file(str(weights), f"{BUCKET}/owned/model.safetensors")
    s3.pipe_file(f"{BUCKET}/owned/graph-notes.json", b'{"format": "clouseau.graph"}')
    _run(url)
    before = {p: s3.cat_file(p) for p in s3.find(f"{BUCKET}/owned")}
    with pytest.raises(clouseau.SelectionError):
        _run(url, select="no_such_point")
    assert {p: s3.cat_file(p) for p in s3.find(f"{BUCKET}/owned")} == before
    workload.assert_equals_eager(clouseau.load(url, strict=True))
    _run(url, select="fc1", calls=workload.batches()[:1])  # traces: replaces its own files
    assert s3.cat_file(f"{BUCKET}/owned/model.safetensors") == weights.read_bytes()
    assert s3.exists(f"{BUCKET}/owned/graph-notes.json")
    cap = clouseau.load(url)
    assert cap.calls == (0,) and cap.names() == ("fc1",)
    assert list(staging.iterdir()) == []


def test_a_second_writer_on_one_url_is_refused(s3, staging) -> None:
    url = f"s3://{BUCKET}/two"
    first = clouseau.instrument(workload.model(), select=workload.SELECT, path=url)
    with pytest.raises(clouseau.CaptureError, match=r"being written by process \d+ on host"):
        clouseau.instrument(workload.model(), select="fc1", path=url)
    with torch.no_grad(), first:
        for batch in workload.batches():
            first(batch)
    workload.assert_equals_eager(clouseau.load(url, strict=True))
    assert not s3.exists(f"{BUCKET}/two/.clouseau.lock")
    _run(url)  # released: a later writer is accepted
    assert list(staging.iterdir()) == []


EXIT_CHILD = textwrap.dedent(
    """
    import sys
    import fsspec, torch
    import clouseau
    from tests.distributed import workload

    fsspec.config.conf["s3"] = {"endpoint_url": sys.argv[2], "key": "testing",
                                "secret": "testing"}
    fmodel = clouseau.instrument(workload.model(), select="fc1", path=sys.argv[1],
                                 max_size_mb=0.001)
    with torch.no_grad():
        for k in range(40):
            fmodel(workload.batches()[k % workload.BATCHES])
    # no close(): the interpreter exits with the capture open
    """
)


def test_an_exit_without_close_uploads_every_call(s3, moto, tmp_path) -> None:
    url = f"s3://{BUCKET}/exit"
    child_tmp = tmp_path / "child-tmp"
    child_tmp.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", EXIT_CHILD, url, f"http://127.0.0.1:{moto}"],
        cwd=ROOT, env={**env(), "TMPDIR": str(child_tmp), "AWS_DEFAULT_REGION": "us-east-1"},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    cap = clouseau.load(url, strict=True)
    assert cap.closed and cap.complete and cap.calls == tuple(range(40))
    eager = workload.eager_points()
    for call in cap.calls:
        np.testing.assert_allclose(
            cap.get("fc1", call=call), eager[call % workload.BATCHES]["fc1"].numpy(), rtol=1e-6
        )
    assert list(child_tmp.iterdir()) == []  # the staging directory is gone


HANG_CHILD = textwrap.dedent(
    """
    import sys, time
    import fsspec, torch
    import clouseau
    from tests.distributed import workload

    fsspec.config.conf["s3"] = {"endpoint_url": sys.argv[2], "key": "testing",
                                "secret": "testing"}
    fmodel = clouseau.instrument(workload.model(), select=workload.SELECT, path=sys.argv[1],
                                 max_size_mb=0.001, timeout_s=3)
    with torch.no_grad():
        for batch in workload.batches():
            fmodel(batch)
    print("written", flush=True)
    sys.stdin.readline()  # the parent has frozen the endpoint
    started = time.monotonic()
    try:
        fmodel.close()
    except clouseau.CaptureError as err:
        print(f"{time.monotonic() - started:.1f}", str(err).replace(chr(10), " "), flush=True)
    else:
        print("closed without an error", flush=True)
    """
)


def test_an_endpoint_that_stops_answering_fails_close_within_the_timeout(
    moto, monkeypatch, tmp_path
) -> None:
    # In a child with a time limit: a close() that hung would fail the test, not stop it.
    proxy = FreezableProxy(("127.0.0.1", moto))
    child = None
    try:
        conf = _configure(monkeypatch, f"http://127.0.0.1:{proxy.port}")
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **conf)
        if not fs.exists(BUCKET):
            fs.mkdir(BUCKET)
        child = subprocess.Popen(
            [sys.executable, "-c", HANG_CHILD, f"s3://{BUCKET}/hang", conf["endpoint_url"]],
            cwd=ROOT, env={**env(), "TMPDIR": str(tmp_path), "AWS_DEFAULT_REGION": "us-east-1"},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "written", child.stderr
        proxy.frozen.set()
        out, err = child.communicate("go\n", timeout=120)
        seconds, message = out.strip().split(" ", 1)
        assert float(seconds) < 60, out
        assert "the endpoint does not answer" in message, (out, err[-2000:])
        assert "the whole capture is still on local disk in" in message
        local = message.rsplit("on local disk in ", 1)[1].split()[0].rstrip(".")
        workload.assert_equals_eager(clouseau.load(local, strict=True))
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.communicate()
        proxy.stop()


def test_a_missing_bucket_names_the_bucket_and_leaks_nothing(s3, staging) -> None:
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(clouseau.CaptureError, match="the bucket 'no-such-bucket' does not exist"):
        clouseau.instrument(workload.model(), select="fc1", path="s3://no-such-bucket/run")
    time.sleep(0.2)
    leaked = {t.name for t in threading.enumerate()} - before
    assert not [n for n in leaked if n.startswith("clouseau")], leaked
    assert list(staging.iterdir()) == []


def test_record_to_a_url_uploads_and_writes_nothing_locally(s3, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path.parent / f"{tmp_path.name}-tmp"))
    os.makedirs(tempfile.tempdir, exist_ok=True)
    url = f"s3://{BUCKET}/record"
    options = {"select": workload.SELECT, "progress": False, "max_size_mb": 0.001}
    cap = clouseau.record(workload.model(), workload.batches(), path=url, **options)
    assert not (tmp_path / "s3:").exists() and list(tmp_path.iterdir()) == []
    remote = clouseau.load(url, strict=True)
    assert remote.complete
    workload.assert_equals_eager(remote)
    workload.assert_equals_eager(cap)
    before = {p: s3.cat_file(p) for p in s3.find(f"{BUCKET}/record")}
    # Resuming a finished recording at the URL changes nothing there.
    again = clouseau.record(workload.model(), workload.batches(), path=url, resume=True, **options)
    workload.assert_equals_eager(again)
    after = {p: s3.cat_file(p) for p in s3.find(f"{BUCKET}/record")}
    assert {k: v for k, v in after.items() if not k.endswith(".clouseau.lock")} == {
        k: v for k, v in before.items() if not k.endswith(".clouseau.lock")
    }


def test_refused_credentials_are_named(s3, monkeypatch, staging) -> None:
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks keys
    conf = {**fsspec.config.conf["s3"], "key": "wrong", "secret": "wrong"}
    monkeypatch.setitem(fsspec.config.conf, "s3", conf)
    with pytest.raises(
        clouseau.CaptureError, match="the credentials were refused for 'clouseau-loc'"
    ):
        clouseau.instrument(workload.model(), select="fc1", path=f"s3://{BUCKET}/creds")
    assert list(staging.iterdir()) == []


@pytest.mark.slow  # starting Ray alone takes 10-20 s here
def test_ray_record_to_a_url_uploads_and_writes_nothing_locally(
    cluster, s3, tmp_path, monkeypatch
) -> None:
    # Issue 26, item 6: ray.record(path="s3://...") wrote a local directory named "s3:".
    ray = pytest.importorskip("ray")
    monkeypatch.chdir(tmp_path)
    url = f"s3://{BUCKET}/ray"
    rows = torch.cat(workload.batches()).numpy()
    dataset = ray.data.from_items([{"x": row} for row in rows], override_num_blocks=3)
    cap = clouseau.ray.record(
        dataset, workload.model, select=workload.SELECT, path=url, concurrency=2,
        batch_size=workload.BATCH_SIZE, num_cpus=0.5,
    )  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # no "s3:" directory, nothing else either
    remote = clouseau.load(url, strict=True)
    assert remote.complete
    workload.assert_equals_eager(remote)
    workload.assert_equals_eager(cap)
