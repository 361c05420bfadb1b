"""``clouseau.ray.record``: record activations over a Ray Data dataset with actor workers.

``map_batches`` runs a pool of actors; each builds the model once (``model_factory()``),
instruments it, and writes every batch it runs as one block file of a part of its own
(:mod:`clouseau.distributed.blocks`). The driver numbers the rows: Ray delivers the
actors' reports in the order of the data (``preserve_order``; or the data has a column of
row numbers), so the input streams through and nothing waits for the whole of it. Ray
reports a block once, even when it ran it twice (its actor died, the task was retried):
the manifest, written by the driver as reports arrive, lists the file reported, and files
nobody reported are removed at the end. ``clouseau.load(path)`` reads the blocks as one
capture, call ``i`` being the ``i``-th batch of the data.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from clouseau.dataset.layout import FieldSource
from clouseau.distributed.block_layout import BlockLayout
from clouseau.distributed.blocks import (
    FORMAT,
    PART_FILE,
    Block,
    BlockCapture,
    block_file,
    clear,
    content_digest,
    content_file,
    content_of,
    earlier_parts,
    found_blocks,
    load_blocks,
    read_manifest,
    remove_unlisted,
    row_ranges,
    write_manifest,
)
from clouseau.ir.errors import CaptureError
from clouseau.ir.selection import SelectLike, check_select
from clouseau.store.capture import encode_record
from clouseau.store.files import write_json
from clouseau.store.layout import FORMAT as STORE_FORMAT
from clouseau.store.location import resolve
from clouseau.store.lock import DirectoryLock
from clouseau.store.safetensors_io import write_file

Forward = Callable[[Any, dict[str, Any]], Any]
_MANIFEST_EVERY_S = 2.0
# Batches an actor gets from Ray at once: it writes each one's file while it runs the
# next, and reports them all once written (a report must never precede its file).
_BATCHES_PER_CALL = 8


def record(
    dataset: Any,
    model_factory: Callable[[], Any],
    select: SelectLike = "*",
    path: str | os.PathLike[str] = ".clouseau",
    *,
    concurrency: int = 2,
    batch_size: int | None = None,
    forward: Forward | None = None,
    id_column: str | None = None,
    resume: bool = False,
    num_cpus: float = 1,
    rows: bool | str | Sequence[str] = False,
    mask: FieldSource | None = None,
    fields: Sequence[str] | Mapping[str, FieldSource] | None = None,
    stats: bool | str | Sequence[str] = False,
) -> BlockCapture:
    """Run a model over a Ray Data dataset on ``concurrency`` actors and record activations.

    Parameters
    ----------
    dataset
        A ``ray.data.Dataset`` whose rows come in a deterministic order (read from files,
        ``from_items``, ``range``): a row is known by its number in that order.
    model_factory
        Builds the model (a ``torch.nn.Module``, a JAX function or an Equinox module), once
        in each actor. It is pickled to the actors: a module-level function.
    select
        The points to record, as for :func:`clouseau.instrument`.
    path
        The capture directory (on a file system every actor sees). Without ``resume`` an
        earlier capture in it is replaced.
    concurrency
        The number of actors.
    batch_size
        Rows per batch (one model call, one block file); None: Ray's blocks as they come.
    forward
        ``forward(fmodel, batch)`` calls the instrumented model once on a batch, a dict of
        numpy columns. Default: with one column, ``fmodel(column)``, else
        ``fmodel(**columns)``, each column as a torch tensor (a JAX array for JAX).
    id_column
        A column holding a unique integer per row (``ray.data.range``'s ``"id"``), which
        numbers the rows and is not passed to the model; None: rows are numbered in the
        order of the data (Ray's ``preserve_order``, set for this run).
    resume
        Keep the blocks already written in ``path`` by the same run and run the rest.
    num_cpus
        CPUs Ray reserves per actor (fractions let other tasks share a small machine).
        Ray Data restarts a dead actor and retries its tasks (its defaults
        ``max_restarts=-1``, ``max_task_retries=-1``).
    rows, mask, fields, stats
        As for :func:`clouseau.record`: points stored as rows (padding dropped with
        ``mask``, the fields ``sample`` and ``position`` beside them, ``sample`` counting
        the rows of the data), columns stored beside the activations, running statistics
        read with ``cap.stats(name)``. Functions given as ``mask`` or ``fields`` are
        pickled to the actors.

    Returns
    -------
    BlockCapture
        ``clouseau.load(path)``: ``cap.get(name, call=i)`` is batch ``i`` of the data,
        ``cap.batches`` their rows.

    Raises
    ------
    CaptureError
        ``resume`` of a different run, or another run writing to ``path``.
    """
    import ray

    check_select(select)
    if select is None:
        raise ValueError("select=None records nothing; select points, e.g. select='h.*'")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1; got {concurrency}")
    location = resolve(path)
    if location.url is not None:  # recorded into a local directory the actors share
        from clouseau.distributed.remote import record_at_url

        options = {"concurrency": concurrency, "batch_size": batch_size, "forward": forward,
                   "id_column": id_column, "resume": resume, "num_cpus": num_cpus,
                   "rows": rows, "mask": mask, "fields": fields, "stats": stats}  # fmt: skip
        return record_at_url(
            location.url,
            lambda local: record(dataset, model_factory, select, local, **options),
            resume,
        )
    layout = BlockLayout.make(rows, mask, fields, stats)  # a bad layout fails here
    root = location.path
    assert root is not None
    root.mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(root)  # a second run on this path is refused here
    try:
        run = {**_identity(model_factory, select, batch_size, id_column), **layout.describe()}
        done = _previous(root, run) if resume else {}
        # The earlier capture goes only once this run has produced its first block (a
        # model that fails in every actor, a typo in select, leave it as it was).
        manifest = _Manifest(root, run, () if resume else earlier_parts(root))
        results = _checked(dataset, id_column).map_batches(
            _Worker,
            fn_constructor_kwargs={
                "root": str(root), "model_factory": model_factory, "select": select,
                "forward": forward, "id_column": id_column,
                "done": [b.to_json() for b in done.values()], "batch_size": batch_size,
                "layout": layout,
            },
            batch_size=batch_size and batch_size * _BATCHES_PER_CALL, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=concurrency), num_cpus=num_cpus,
        )  # fmt: skip
        try:
            blocks = _collect(results, id_column is None, manifest.save)
        except BaseException:
            manifest.abandon()
            raise
        manifest.save(blocks, complete=True)
        remove_unlisted(root, blocks)  # what killed actors wrote and nobody reported
    finally:
        lock.release()
    return load_blocks(root)


class _Manifest:
    """Writes the manifest as blocks are reported; the first write removes the earlier
    capture's parts (``earlier``)."""

    def __init__(self, root: Path, run: dict[str, Any], earlier: Sequence[str]) -> None:
        self.root, self.run, self.earlier = root, run, tuple(earlier)
        self.before = set(earlier_parts(root, any_manifest=True))
        self.saved = False

    def save(self, blocks: Sequence[Block], complete: bool = False) -> None:
        if self.earlier:
            clear(self.root, self.earlier)
            self.earlier = ()
        write_manifest(self.root, self.run, blocks, complete)
        self.saved = True

    def abandon(self) -> None:
        """The run failed before its first block: remove the parts its actors created."""
        if not self.saved:
            new = set(earlier_parts(self.root, any_manifest=True)) - self.before
            clear(self.root, sorted(new))


def _identity(
    model_factory: Callable[[], Any], select: SelectLike, batch_size: int | None, ids: str | None
) -> dict[str, Any]:
    factory = f"{getattr(model_factory, '__module__', '')}.{getattr(model_factory, '__qualname__', repr(model_factory))}"
    chosen = select if isinstance(select, str) else list(select) if isinstance(select, list | tuple) else repr(select)  # fmt: skip
    return {"model_factory": factory, "select": chosen, "batch_size": batch_size, "id_column": ids}


def _previous(root: Path, run: Mapping[str, Any]) -> dict[str, Block]:
    manifest = read_manifest(root)
    if manifest is None:
        return {}
    if manifest.get("run") != dict(run):
        raise CaptureError(
            f"cannot resume the recording in {root}: it was made with {manifest.get('run')}, "
            f"this run is {dict(run)}; resume the same run, or record without resume=True"
        )
    listed = {b["file"]: Block.from_json(b) for b in manifest.get("blocks", [])}
    return {**found_blocks(root), **listed}


def _checked(dataset: Any, id_column: str | None) -> Any:
    if id_column is not None and id_column not in dataset.schema().names:
        raise ValueError(
            f"id_column={id_column!r} is not a column of the dataset "
            f"({dataset.schema().names}); name a column of unique row numbers"
        )
    return dataset


def _collect(results: Any, in_order: bool, save: Callable[[list[Block]], None]) -> list[Block]:
    """The blocks the actors report, each once; ``save`` them every few seconds.

    ``in_order``: the rows carry no number, so Ray delivers the reports in the order of
    the data (``preserve_order``) and the driver numbers each block's rows as they come.
    """
    options = results.context.execution_options
    ordered, options.preserve_order = options.preserve_order, options.preserve_order or in_order
    blocks: dict[tuple[tuple[int, int], ...], Block] = {}
    rows, last = 0, time.monotonic()
    try:
        for row in results.iter_rows():
            report = json.loads(row["block"])
            if in_order:
                size = report.pop("size")
                report["rows"], rows = [[rows, rows + size]], rows + size
            block = Block.from_json(report)
            blocks.setdefault(block.rows, block)  # a retried block: the first report stays
            if len(blocks) == 1 or time.monotonic() - last > _MANIFEST_EVERY_S:
                save(list(blocks.values()))
                last = time.monotonic()
    finally:
        options.preserve_order = ordered  # the dataset's context is the caller's too
    return list(blocks.values())


class _Worker:
    """One actor: the instrumented model, and the part it writes its blocks into."""

    def __init__(
        self,
        root: str,
        model_factory: Callable[[], Any],
        select: SelectLike,
        forward: Forward | None,
        id_column: str | None,
        done: Sequence[Mapping[str, Any]],
        batch_size: int | None,
        layout: BlockLayout,
    ) -> None:
        from clouseau.capture import frontend_for
        from clouseau.dataset.sink import BatchSink
        from clouseau.store.layout import graph_file

        self.root, self.id_column = Path(root), id_column
        # Blocks of an earlier run: by name (rows numbered by a column) or by content.
        self.done = {b["file"]: Block.from_json(b) for b in done}
        self.done_content = {
            content_of(b.file): b for b in self.done.values() if content_of(b.file)
        }
        self.batch_size, self.layout = batch_size, layout
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="clouseau-blocks")
        self.part = self.root / f"part-{uuid.uuid4().hex[:12]}"
        self.part.mkdir()
        about = {"format": FORMAT, "engine": "ray", "pid": os.getpid()}
        write_json(self.part / PART_FILE, about, replace=True)
        model = model_factory()
        frontend = frontend_for(model)
        self.is_jax = frontend.name == "jax"

        def write_graph(graph_id: int, graph: Any) -> None:
            write_json(self.part / graph_file(graph_id), graph.to_json(), replace=True)

        self.sink = BatchSink(self.part, (), write_graph)
        self.fmodel = frontend.instrument(
            model, select=select, sink=self.sink, intervene=None, grads=False
        )
        self.forward = forward or _default_forward

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = batch.pop(self.id_column) if self.id_column else None  # not a model input
        count = len(next(iter(batch.values())))
        size = self.batch_size or count
        reports, writing = [], None
        try:
            for start in range(0, count, size):
                piece = slice(start, start + size)
                columns = {k: v[piece] for k, v in batch.items()}
                block, earlier = self._block(columns, None if rows is None else rows[piece])
                if earlier is None:
                    items = self._saved(columns)
                    if writing is not None:
                        writing.result()  # one file in flight: memory stays bounded
                    writing = self.writer.submit(self._write, block, items)
                report = (earlier or block).to_json()
                if rows is None:  # numbered by the driver, in order
                    report["size"] = min(size, count - start)
                    del report["rows"]
                reports.append(json.dumps(report))
        finally:
            if writing is not None:
                writing.result()
        return {"block": np.array(reports)}

    def _block(
        self, columns: dict[str, np.ndarray], rows: np.ndarray | None
    ) -> tuple[Block, Block | None]:
        """The block of one batch, and the block an earlier run wrote for it, if any."""
        if rows is not None:  # named by its rows: a retry writes the same file again
            name = block_file(rows)
            return Block(self.part.name, name, row_ranges(rows)), self.done.get(name)
        content = content_digest(columns)
        name = content_file(content)  # unique: a retry's file is another, never listed
        return Block(self.part.name, name, ()), self.done_content.get(content)

    def _saved(self, batch: dict[str, np.ndarray]) -> list[tuple[Any, np.ndarray]]:
        """Run the model on one batch; the records and arrays it saved."""
        from clouseau.dataset.recorder import run_forward

        self.sink.start_batch(0)
        try:
            shaper = self.layout.shaper(batch)
            self.sink.shaper = shaper
            run_forward(self.forward, self.fmodel, self._inputs(batch), self.is_jax)
            for name, array in shaper.fields(batch, 0):  # samples counted in the block
                self.sink.put_field(name, array)
            self.sink.end_batch()
            return self.sink.buffer
        finally:
            self.sink.buffer, self.sink.buffer_bytes = [], 0

    def _write(self, block: Block, items: list[tuple[Any, np.ndarray]]) -> None:
        records = "[" + ",".join(encode_record(r) for r, _ in items) + "]"
        meta = {"format": STORE_FORMAT, "clouseau": records, **self.layout.metadata(items)}
        if block.rows:
            meta["clouseau.rows"] = json.dumps([list(r) for r in block.rows])
        write_file(self.part / block.file, [(r.key, a) for r, a in items], meta)

    def _inputs(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        if self.is_jax:
            import jax.numpy as jnp

            return {k: jnp.asarray(v) for k, v in batch.items()}
        import torch

        # A copy: Ray's batches are read-only views of its object store.
        return {k: torch.from_numpy(np.array(v)) for k, v in batch.items()}


def _default_forward(fmodel: Any, batch: dict[str, Any]) -> Any:
    if len(batch) == 1:
        return fmodel(next(iter(batch.values())))
    return fmodel(**batch)


__all__ = ["record"]
