"""The tables' first path, ``clouseau.tables``, kept working: they are :mod:`clouseau.ir.tables`."""

from clouseau.ir.tables import capture_frame, points_frame, summary, summary_table

__all__ = ["capture_frame", "points_frame", "summary", "summary_table"]
