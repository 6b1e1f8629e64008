"""Backplanes: how events reach every instance of one gateway, all in one order."""

from .base import Backplane, BackplaneUnavailable, MemoryBackplane, backplane_from_config

__all__ = ["Backplane", "BackplaneUnavailable", "MemoryBackplane", "backplane_from_config"]
