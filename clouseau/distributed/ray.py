"""``clouseau.ray.record``: record activations over a Ray Data dataset with actor workers.

``map_batches`` runs a pool of actors; each builds the model once (``model_factory()``),
instruments it, and writes every batch it runs as one block file of a part of its own
(:mod:`clouseau.distributed.blocks`). A block is named by its rows, so a block that Ray
runs again (its actor died, the task was retried) gets the same name, and the manifest,
written by the driver as results arrive, keeps it once. ``clouseau.load(path)`` reads the
blocks as one capture, call ``i`` being the ``i``-th batch of the data.
"""

from __future__ import annotations

import json
import os
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from clouseau.distributed.blocks import (
    FORMAT,
    PART_FILE,
    Block,
    BlockCapture,
    block_file,
    clear,
    found_blocks,
    load_blocks,
    read_manifest,
    row_ranges,
    write_manifest,
)
from clouseau.ir.errors import CaptureError
from clouseau.ir.selection import SelectLike, check_select
from clouseau.store.capture import encode_record
from clouseau.store.directory import capture_path
from clouseau.store.files import write_json
from clouseau.store.layout import FORMAT as STORE_FORMAT
from clouseau.store.lock import DirectoryLock
from clouseau.store.safetensors_io import write_file

ROW = "__clouseau_row"
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
        numbers the rows instead of their order and is not passed to the model; None: rows
        are numbered by their order (``Dataset.zip`` with a range).
    resume
        Keep the blocks already written in ``path`` by the same run and run the rest.
    num_cpus
        CPUs Ray reserves per actor (fractions let other tasks share a small machine).
        Ray Data restarts a dead actor and retries its tasks (its defaults
        ``max_restarts=-1``, ``max_task_retries=-1``).

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
    root = capture_path(path)
    root.mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(root)  # a second run on this path is refused here
    try:
        run = _identity(model_factory, select, batch_size, id_column)
        done = _previous(root, run) if resume else {}
        if not resume:
            clear(root)
        write_manifest(root, run, done.values(), complete=False)
        results = _with_rows(dataset, id_column).map_batches(
            _Worker,
            fn_constructor_kwargs={
                "root": str(root), "model_factory": model_factory, "select": select,
                "forward": forward, "id_column": id_column,
                "done": {name: b.to_json() for name, b in done.items()},
                "batch_size": batch_size,
            },
            batch_size=batch_size and batch_size * _BATCHES_PER_CALL, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=concurrency), num_cpus=num_cpus,
        )  # fmt: skip
        blocks = dict(done)
        last = time.monotonic()
        for row in results.iter_rows():
            block = Block.from_json(json.loads(row["block"]))
            blocks.setdefault(block.file, block)  # a retried block: the first report stays
            if time.monotonic() - last > _MANIFEST_EVERY_S:
                write_manifest(root, run, blocks.values(), complete=False)
                last = time.monotonic()
        write_manifest(root, run, blocks.values(), complete=True)
    finally:
        lock.release()
    return load_blocks(root)


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


def _with_rows(dataset: Any, id_column: str | None) -> Any:
    if id_column is not None:
        if id_column not in dataset.schema().names:
            raise ValueError(
                f"id_column={id_column!r} is not a column of the dataset "
                f"({dataset.schema().names}); name a column of unique row numbers"
            )
        return dataset
    import ray

    rows = ray.data.range(dataset.count()).rename_columns({"id": ROW})
    with warnings.catch_warnings():
        # zip is deprecated for datasets whose order is not deterministic; the order of
        # this one is the contract of record (see the docstring).
        warnings.simplefilter("ignore", DeprecationWarning)
        return dataset.zip(rows)


class _Worker:
    """One actor: the instrumented model, and the part it writes its blocks into."""

    def __init__(
        self,
        root: str,
        model_factory: Callable[[], Any],
        select: SelectLike,
        forward: Forward | None,
        id_column: str | None,
        done: Mapping[str, Any],
        batch_size: int | None,
    ) -> None:
        from clouseau.capture import frontend_for
        from clouseau.dataset.sink import BatchSink
        from clouseau.store.layout import graph_file

        self.root, self.id_column = Path(root), id_column
        self.done = {name: Block.from_json(b) for name, b in done.items()}
        self.batch_size = batch_size
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
        rows = batch.pop(self.id_column or ROW)  # row numbers, not an input of the model
        size = self.batch_size or len(rows)
        blocks, writing = [], None
        try:
            for start in range(0, len(rows), size):
                piece = slice(start, start + size)
                name = block_file(rows[piece])
                if name in self.done:  # resumed: written by an earlier run
                    blocks.append(self.done[name])
                    continue
                block = Block(self.part.name, name, row_ranges(rows[piece]))
                items = self._saved({k: v[piece] for k, v in batch.items()})
                if writing is not None:
                    writing.result()  # one file in flight: memory stays bounded
                writing = self.writer.submit(self._write, block, items)
                blocks.append(block)
        finally:
            if writing is not None:
                writing.result()
        return {"block": np.array([json.dumps(b.to_json()) for b in blocks])}

    def _saved(self, batch: dict[str, np.ndarray]) -> list[tuple[Any, np.ndarray]]:
        """Run the model on one batch; the records and arrays it saved."""
        from clouseau.dataset.recorder import run_forward

        self.sink.start_batch(0)
        try:
            run_forward(self.forward, self.fmodel, self._inputs(batch), self.is_jax)
            self.sink.end_batch()
            return self.sink.buffer
        finally:
            self.sink.buffer, self.sink.buffer_bytes = [], 0

    def _write(self, block: Block, items: list[tuple[Any, np.ndarray]]) -> None:
        records = "[" + ",".join(encode_record(r) for r, _ in items) + "]"
        meta = {"format": STORE_FORMAT, "clouseau": records}
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
