"""Activation datasets: record a model over a dataset (:func:`record`), resume, statistics."""

from clouseau.dataset.record import record
from clouseau.store.stats import PointStats

__all__ = ["PointStats", "record"]
