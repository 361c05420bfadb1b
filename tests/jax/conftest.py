"""The JAX frontend tests need jax and equinox; the recording sink is tests/conftest.py's."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")
pytest.importorskip("equinox")
