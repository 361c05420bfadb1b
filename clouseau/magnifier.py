"""The seed's ``from clouseau import magnifier`` import: the viewing half of the inspector."""

from clouseau.inspector import magnify, read_from_safetensors

__all__ = ["magnify", "read_from_safetensors"]
