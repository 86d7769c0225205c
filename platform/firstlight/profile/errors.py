"""The profiler's error, defined with the rest of the tree in :mod:`firstlight.errors`."""

from __future__ import annotations

from firstlight.errors import ProfilingError

__all__ = ["ProfilingError"]
