"""``load`` against the number of files: 40,000 files of a capture against 10,000.

``clouseau.load`` reads every file's header (never its arrays), so its time should grow
with the number of files and no faster. The capture is written by the store's own writer
(one small array per file, ``max_size_mb`` below it), then loaded cold and warm: a
quadratic step (a list searched per file) would make the ratio about 16x; the target of
issue 26 is at most 4.5x for 4x the files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.harness import Config, Variant, progress, run_variants, scratch_dir
from bench.report import Check, Report, Table

RATIO_LIMIT = 4.5


def load_scaling(cfg: Config) -> Report:
    """Time ``clouseau.load`` of a capture of N files and of 4N files (N = 10,000)."""
    small = 100 if cfg.tiny else 10_000
    report = Report(
        name="load-files",
        title=f"load() of {4 * small:,} files vs {small:,} files",
        description="One call of one 64-byte array per file, written by the store's "
        "DirectorySink; `clouseau.load(path)` reads every header and lists the arrays "
        "(none is read).",
        plain=f"{small:,} files",
    )
    with scratch_dir(cfg, "load") as d:
        paths = {}
        for count in (small, 4 * small):
            progress(f"load-files: writing {count:,} files")
            paths[count] = _write(d / f"n{count}", count)
        variants = [
            Variant(f"{count:,} files", step=lambda p=path: _load(p))
            for count, path in paths.items()
        ]
        report.results = run_variants(variants, cfg, reps=min(cfg.reps, 5))
    ratio = report.ratio(f"{4 * small:,} files", f"{small:,} files")
    report.tables.append(
        Table("Per file", ["files", "seconds per 1,000 files"], [
            [f"{count:,}", f"{r.median / count * 1000:.4f}"]
            for count, r in zip(paths, report.results, strict=True) if r.ok
        ])
    )  # fmt: skip
    report.checks.append(Check(f"load of {4 * small:,} files / {small:,} files", ratio, RATIO_LIMIT, "<="))  # fmt: skip
    return report


def _write(path: Path, files: int) -> Path:
    from clouseau.ir import DType, Graph, Node, NodeKind, Ref, TensorSpec
    from clouseau.ir.sink import SavedValue
    from clouseau.store.directory_sink import DirectorySink

    spec = TensorSpec((16,), DType.FLOAT32)
    graph = Graph((
        Node("x", NodeKind.INPUT, "input", outputs=(spec,)),
        Node("relu", NodeKind.OP, "relu", (Ref("x"),), (spec,)),
        Node("output", NodeKind.OUTPUT, "output", (Ref("relu"),)),
    ))  # fmt: skip
    sink = DirectorySink(path, max_size_mb=1e-6)  # every array in a file of its own
    graph_id = sink.add_graph(graph)
    value = np.arange(16, dtype=np.float32)
    for _ in range(files):
        call = sink.begin_call()
        sink.put(call, graph_id, [SavedValue(("relu",), "relu", value, ())])
        sink.end_call(call)
    sink.close()
    return path


def _load(path: Path) -> int:
    import clouseau

    return len(clouseau.load(path).entries)
