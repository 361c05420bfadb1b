"""Every case of the sweep by id (``family:key``), and how the worker runs one."""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from bench.zoo.outcome import Outcome

if TYPE_CHECKING:
    from bench.zoo.check_torch import TorchCase

FAMILIES = ("jax", "torchvision", "timm", "transformers")


def case_ids(only: tuple[str, ...] = FAMILIES) -> list[str]:
    """The ids of ``only``'s cases, interleaved family by family, so that a sweep cut
    short has covered every family alike."""
    lists = [[f"{family}:{key}" for key in _keys(family)] for family in only]
    mixed = itertools.chain.from_iterable(itertools.zip_longest(*lists))
    return [i for i in mixed if i is not None]


def _keys(family: str) -> list[str]:
    quiet()
    if family == "jax":
        from bench.zoo.jax_models import CASES

        return list(CASES)
    if family == "torchvision":
        from bench.zoo.vision import torchvision_builders

        return torchvision_builders()
    if family == "timm":
        from bench.zoo.vision import timm_sample

        return timm_sample()
    from bench.zoo.hf import cases

    return [f"{model_type}/{task}" for model_type, task in cases()]


def run(case_id: str) -> Outcome:
    """Build and check one case (in the worker process)."""
    quiet()
    family, key = case_id.split(":", 1)
    if family == "jax":
        from bench.zoo.check_jax import run_case
        from bench.zoo.jax_models import CASES

        return run_case(CASES[key]())
    from bench.zoo import check_torch

    return check_torch.run_case(torch_builder(case_id), family, key)


def torch_builder(case_id: str) -> Callable[[], TorchCase]:
    """The function that builds a PyTorch case (torchvision, timm, transformers)."""
    family, key = case_id.split(":", 1)
    from bench.zoo import vision

    if family == "torchvision":
        return lambda: vision.torchvision_case(key)
    if family == "timm":
        return lambda: vision.timm_case(key)
    from bench.zoo import hf

    model_type, task = key.split("/")
    return lambda: hf.build(model_type, task)


def quiet() -> None:
    """One thread (the sweep runs a worker per core), the torchvision operators defined,
    and the libraries' notices off: the worker's output is its result."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import importlib

    importlib.import_module("tests.conftest")  # torchvision's operators, before its import
    warnings.simplefilter("ignore")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
