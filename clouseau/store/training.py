"""``cap.to_torch_dataset``: rows as a map-style torch Dataset for a DataLoader with workers.

The dataset holds the columns (file paths and offsets); a worker process started by pickling
opens the files again on first use, so nothing large is pickled. A forked worker reads
through the descriptors it inherits, with ``pread``: no file offset is shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from clouseau.store.rows import Column, columns, convert, names_of

if TYPE_CHECKING:
    from clouseau.store.capture import Capture


class RowDataset(torch.utils.data.Dataset):
    """Rows of one or several names; ``ds[i]`` is a row, ``ds[list_of_i]`` a batch."""

    def __init__(self, names: tuple[str, ...], cols: tuple[Column, ...], single: bool) -> None:
        self.names, self.cols, self.single = names, cols, single

    @staticmethod
    def make(cap: Capture, names: str | Sequence[str]) -> RowDataset:
        wanted, single = names_of(names)
        return RowDataset(wanted, columns(cap, wanted), single)

    def __len__(self) -> int:
        return len(self.cols[0])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int | np.integer):
            n = len(self)
            i = int(index) + n if index < 0 else int(index)
            if not 0 <= i < n:
                raise IndexError(f"row {index} is out of range for {n} rows")
            arrays = [c.slice(i, i + 1)[0] for c in self.cols]
        else:
            rows = np.asarray(index, dtype=np.int64)
            arrays = [c.take(rows) for c in self.cols]
        out = [convert(np.ascontiguousarray(a), "torch") for a in arrays]
        return out[0] if self.single else dict(zip(self.names, out, strict=True))
