"""``clouseau.record``: run a model over a dataset and write its activations as one capture.

Each batch is one call of the instrumented model (call index = batch index). Files are cut
between batches (see :mod:`clouseau.dataset.sink`) and each written file is followed by the
progress record (:mod:`clouseau.store.progress`), which is all resume trusts.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from clouseau.capture import Frontend, frontend_for
from clouseau.dataset.bar import Bar
from clouseau.dataset.directory import Directory, forward_identity
from clouseau.dataset.fingerprint import batch_digest, leaves, model_digest
from clouseau.dataset.layout import BatchRows, FieldSource, Layout, take
from clouseau.dataset.sink import BatchSink
from clouseau.distributed import record_part
from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.ir.selection import SelectLike, check_select
from clouseau.store.capture import Capture
from clouseau.store.directory import check_pattern, file_name, max_bytes
from clouseau.store.layout import DEFAULT_PATTERN
from clouseau.store.location import resolve
from clouseau.store.progress import Batch, Progress, write_progress
from clouseau.store.reader import load
from clouseau.store.stats import RunningStats

Forward = Callable[[Any, Any], Any]


def record(
    model: Any,
    data: Iterable[Any],
    select: SelectLike = "*",
    path: str | os.PathLike[str] = ".clouseau",
    *,
    forward: Forward | None = None,
    rows: bool | str | Sequence[str] = False,
    mask: FieldSource | None = None,
    fields: Sequence[str] | Mapping[str, FieldSource] | None = None,
    stats: bool | str | Sequence[str] = False,
    resume: bool = False,
    on_error: str = "stop",
    progress: bool = True,
    max_size_mb: float = 256,
    filename_pattern: str = DEFAULT_PATTERN,
) -> Capture:
    """Run ``model`` over every batch of ``data`` and record the selected activations.

    Parameters
    ----------
    model
        A ``torch.nn.Module`` (run under ``torch.no_grad``, in the mode it is in), a JAX
        function or an Equinox module.
    data
        An iterable of batches: a ``DataLoader``, a list, a generator, a JAX array
        iterator. Resuming iterates it again from the start, so it must give the same
        batches in the same order (seed a shuffling loader).
    select
        The points to record, as for :func:`clouseau.instrument`.
    path
        The capture directory. Without ``resume`` an earlier capture in it is replaced.
    forward
        ``forward(fmodel, batch)`` runs the instrumented model on one batch, once (wrap it
        in your ``jax.jit`` / ``eqx.filter_jit`` to record inside your jit). Default:
        ``fmodel(**batch)`` for a dict, ``fmodel(*batch)`` for a tuple or list,
        ``fmodel(batch)`` otherwise.
    rows
        Store points as rows: ``True`` for every selected point, or globs of point names.
        A ``[batch, seq, ...]`` value becomes ``[tokens, ...]`` and the fields ``sample``
        and ``position`` are stored beside it.
    mask
        With ``rows``: the positions to keep (padding is dropped), as a key of a dict
        batch (``"attention_mask"``) or a function ``batch -> [batch, seq]`` array.
    fields
        Per-sample or per-token inputs stored beside the activations (masked like the rows
        with ``rows``): batch keys (``["input_ids"]``) or ``{name: key or function}``.
    stats
        Running mean, variance, min, max (per feature, the last axis) and mean row norm,
        for ``True`` every stored point or globs of names; read with ``cap.stats(name)``.
    resume
        Continue the recording in ``path`` after its last complete file, skipping the
        batches it holds (no forward pass); refused if the model, selection, layout or
        data length changed. Without a recording in ``path``, starts afresh.
    on_error
        ``"stop"`` (default): a failing batch stops the run, after writing every batch
        before it; ``"skip"``: it is recorded as a failed call (``cap.failed_calls``) and
        the run goes on.
    progress
        Show a progress line (batches, samples/s, MB/s) when stderr is a terminal.
    max_size_mb, filename_pattern
        As for :func:`clouseau.instrument`; a file holds whole batches, so a batch is on
        disk completely or not at all (and one batch may exceed the limit).

    Returns
    -------
    Capture
        ``clouseau.load(path)``: ``cap.get(name, call=batch)``, ``cap.batches``,
        ``cap.iter_batches(...)``, ``cap.array(name)``, ``cap.stats(name)``.

    Raises
    ------
    CaptureError
        A resume that does not continue the same run, or a disk that is full (the
        message names the batch a resumed run continues from).
    """
    if on_error not in ("stop", "skip"):
        raise ValueError(f"on_error must be 'stop' or 'skip'; got {on_error!r}")
    check_select(select)
    if select is None:
        raise ValueError("select=None records nothing; select points, e.g. select='h.*'")
    max_bytes(max_size_mb)
    names = check_pattern(filename_pattern)
    location = resolve(path)
    if location.url is not None:  # recorded locally, uploaded through the location layer
        return _record_at_url(location.url, locals(), resume)
    layout = Layout.make(rows, mask, fields)
    stat_globs = _globs(stats, "stats")
    frontend = frontend_for(model)
    run = {
        "model": model_digest(model),
        "select": _describe(select),
        **layout.describe(),
        "stats": list(stat_globs),
        "data_len": _length(data),
        "max_size_mb": max_size_mb,
        "filename_pattern": filename_pattern,
        "forward": forward_identity(forward),
    }
    root = location.path
    assert root is not None  # a local directory (a URL returned above)
    # Under torchrun each rank records its share into a part of its own (docs/distributed.md);
    # the part takes every lock before anything is touched.
    part = record_part(root)
    directory = (
        Directory(part.path, part.lock, part.start) if part is not None else Directory.open(root)
    )
    try:
        previous = directory.prepare(run, resume, names)
        if previous is not None and previous.done:
            directory.repair(previous)  # a finished recording: nothing else changes
            cap = load(directory.root)
        else:
            recorder = _Recorder(
                directory, frontend, model, select, layout, stat_globs, run, previous, on_error,
                max_size_mb, filename_pattern, forward or _default_forward, Bar(run["data_len"], progress),
            )  # fmt: skip
            cap = recorder.run(data)
    finally:
        directory.release()
    if part is None:
        return cap
    part.finish()
    return load(part.root)


def _record_at_url(url: str, arguments: dict[str, Any], resume: bool) -> Capture:
    from clouseau.distributed import current_group
    from clouseau.distributed.remote import record_at_url

    if current_group() is not None:
        raise CaptureError(
            f"clouseau.record under torchrun writes parts to a shared directory; {url} is a "
            "URL: record to a directory every rank sees, then upload it (or use "
            "clouseau.instrument, whose parts go to the URL)"
        )
    options = {k: v for k, v in arguments.items() if k in _OPTIONS}
    model, data = arguments["model"], arguments["data"]
    return record_at_url(
        url.rstrip("/"), lambda local: record(model, data, path=local, **options), resume
    )


_OPTIONS = ("select", "forward", "rows", "mask", "fields", "stats", "resume", "on_error",
            "progress", "max_size_mb", "filename_pattern")  # fmt: skip


class _Recorder:
    """The state of one recording run (see :func:`record`)."""

    def __init__(
        self,
        directory: Directory,
        frontend: Frontend,
        model: Any,
        select: SelectLike,
        layout: Layout,
        stat_globs: tuple[str, ...],
        run: dict[str, Any],
        previous: Progress | None,
        on_error: str,
        max_size_mb: float,
        filename_pattern: str,
        forward: Forward,
        bar: Bar,
    ) -> None:
        self.directory, root = directory, directory.root
        self.root, self.layout, self.identity, self.on_error = root, layout, run, on_error
        self.stat_globs, self.forward, self.bar = stat_globs, forward, bar
        self.max_bytes = max_bytes(max_size_mb)
        self.pattern = filename_pattern
        self.done: list[Batch] = list(previous.batches) if previous else []
        self.files: list[str] = list(previous.files) if previous else []
        self.stats = {
            name: RunningStats.from_json(state)
            for name, state in (previous.stats if previous else {}).items()
        }
        self.written = len(self.done)  # batches in files listed by the progress record
        self.resumed = len(self.done)
        self.nbytes = 0
        graphs = directory.graphs() if previous else ()
        self.sink = BatchSink(root, graphs, self._write_graph)
        self.is_jax = frontend.name == "jax"
        self.fmodel = frontend.instrument(
            model, select=select, sink=self.sink, intervene=None, grads=False
        )

    def run(self, data: Iterable[Any]) -> Capture:
        try:
            self._loop(data)
            self._flush()
        except BaseException as err:
            self._stop(err)
            raise
        finally:
            self.sink.stop()
            self.bar.close()
        self._write_progress(done=True)
        return load(self.root)

    def _loop(self, data: Iterable[Any]) -> None:
        iterator = iter(data)
        index = 0
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            except Exception as err:
                if index < self.resumed and self.done[index].error is not None:
                    index += 1  # it failed the same way when recorded: skipped again
                    continue
                if self.on_error == "stop" or index < self.resumed:
                    raise
                self._skip(index, self._next_sample(), self._next_sample(), "", err)
                index += 1
                continue
            if index < self.resumed:
                self._check_replayed(index, batch)
            else:
                self._batch(index, batch)
            index += 1
            self.bar.update(index, self._next_sample(), self.nbytes)
        if index < self.resumed:
            raise CaptureError(
                f"cannot resume the recording in {self.root}: the data gave {index} batches, "
                f"but {self.resumed} were recorded; resume with the same data"
            )

    def _batch(self, index: int, batch: Any) -> None:
        start = stop = self._next_sample()
        digest = ""
        sink = self.sink
        sink.start_batch(index)
        try:
            mask = take(batch, self.layout.mask, "mask") if self.layout.mask else None
            stop = start + _batch_size(batch, mask)
            digest = batch_digest(batch)
            shaper = BatchRows(self.layout, mask)
            sink.shaper = shaper
            self._forward(batch)
            self.directory.start()
            for name, array in shaper.fields(batch, start):
                sink.put_field(name, array)
            if sink.began == 0:
                raise CaptureError(
                    f"forward(fmodel, batch) did not call the instrumented model on batch "
                    f"{index}; call fmodel, not the original model"
                )
        except Exception as err:
            sink.drop_batch()
            if self.on_error == "stop" or sink.error is not None:
                raise
            self._skip(index, start, stop, digest, err)
            return
        except BaseException:
            sink.drop_batch()
            raise
        self._update_stats(sink.pending)
        self.nbytes += sum(a.nbytes for _, a in sink.pending)
        sink.end_batch()
        self.done.append(Batch(index, start, stop, digest))
        if sink.buffer_bytes >= self.max_bytes:
            self._submit()

    def _forward(self, batch: Any) -> None:
        run_forward(self.forward, self.fmodel, batch, self.is_jax)

    def _skip(self, index: int, start: int, stop: int, digest: str, err: BaseException) -> None:
        self.directory.start()
        self.sink.fail_call(index, err)
        self.done.append(Batch(index, start, stop, digest, self.sink.failed[index]))

    def _check_replayed(self, index: int, batch: Any) -> None:
        recorded = self.done[index]
        if recorded.digest and batch_digest(batch) != recorded.digest:
            raise CaptureError(
                f"cannot resume the recording in {self.root}: batch {index} of the data "
                "differs from the recorded one (other samples, order or shapes); resume "
                "with the same data in the same order (seed a shuffling loader)"
            )

    def _update_stats(self, items: list[Any]) -> None:
        if not self.stat_globs:
            return
        for record, array in items:
            name = record.name
            if record.node != "field" and any(
                fnmatch.fnmatchcase(name, g) for g in self.stat_globs
            ):
                self.stats.setdefault(name, RunningStats()).update(array)

    def _next_sample(self) -> int:
        return self.done[-1].stop if self.done else 0

    # -- files and the progress record -------------------------------------------------
    def _submit(self) -> None:
        self.directory.start()
        name = file_name(self.pattern, len(self.files))
        self.files.append(name)
        snapshot = self._progress(done=False)
        count = len(self.done)

        def written() -> None:
            write_progress(self.root, snapshot)
            self.written = count

        self.sink.submit(self.root / name, written)

    def _flush(self) -> None:
        if self.sink.buffer:
            self._submit()
        self.sink.wait()

    def _stop(self, err: BaseException) -> None:
        """Keep every whole batch before ``err`` and say where a resumed run continues."""
        with contextlib.suppress(BaseException):
            self._flush()
            self._write_progress(done=False)
        kept = f"batches 0..{self.written - 1} are" if self.written else "no batch is"
        where = (
            f"{kept} recorded in {self.root}; "
            f"clouseau.record(..., resume=True) continues from batch {self.written}"
        )
        if isinstance(err, CaptureError) and not str(err).startswith("cannot resume"):
            err.args = (f"{err}. {where[0].upper()}{where[1:]}",)
        elif not isinstance(err, CaptureError):
            err.add_note(f"clouseau.record: {where}")

    def _progress(self, done: bool) -> Progress:
        stats = {name: s.to_json() for name, s in self.stats.items()}
        return Progress(self.identity, tuple(self.files), tuple(self.done), stats, done)

    def _write_progress(self, done: bool) -> None:
        if self.sink.buffer or self.sink.error is not None:
            # Batches that never reached a file: the record keeps listing what files hold.
            return
        if done:
            self.directory.start()  # an empty recording is still a recording
        if not self.directory.started:
            return  # nothing traced: the earlier recording stays as it was
        progress = self._progress(done)
        write_progress(self.root, progress)
        self.written = len(self.done)
        self.directory.write_status(progress, len(self.sink.graphs))

    def _write_graph(self, graph_id: int, graph: Graph) -> None:
        self.directory.start()  # the new run has traced: the earlier recording goes now
        self.directory.write_graph(graph_id, graph)


def _default_forward(fmodel: Any, batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return fmodel(**batch)
    if isinstance(batch, tuple | list):
        return fmodel(*batch)
    return fmodel(batch)


def _batch_size(batch: Any, mask: Any) -> int:
    if mask is not None:
        return int(mask.shape[0])
    for array in leaves(batch):
        if array.ndim:
            return int(array.shape[0])
    return 1


def _length(data: Iterable[Any]) -> int | None:
    try:
        return len(data)  # type: ignore[arg-type]
    except TypeError:
        return None


def _globs(value: bool | str | Sequence[str], what: str) -> tuple[str, ...]:
    if value is True:
        return ("*",)
    if value is False or value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"{what} must be True, False, a glob or a list of globs; got {value!r}")


def _describe(select: SelectLike) -> Any:
    if select is None or isinstance(select, str):
        return select
    if isinstance(select, list | tuple) and all(isinstance(s, str) for s in select):
        return list(select)
    return getattr(select, "__qualname__", repr(select))


def run_forward(forward: Any, fmodel: Any, batch: Any, is_jax: bool) -> None:
    """One batch through ``forward(fmodel, batch)``, its saves all delivered on return."""
    if is_jax:
        import jax

        forward(fmodel, batch)
        jax.effects_barrier()  # saves made inside a jit arrive by host callback
        return
    import torch

    with torch.no_grad():
        forward(fmodel, batch)
