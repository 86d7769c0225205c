"""``firstlight profile``: py-spy flame graphs and top frames of a running local region.

* :mod:`~firstlight.profile.stacks` — pure: collapsed stacks parsed, frames ranked by
  self time.
* :mod:`~firstlight.profile.replicas` — a region's replica processes, from the Ray
  cluster's actor table.
* :mod:`~firstlight.profile.record` — py-spy run on each process at once (asyncio
  subprocesses with a deadline); :func:`profile_region` ties the three together.

Importing this package imports no Ray: the Ray lookup happens inside the call.
"""

from firstlight.profile.errors import ProfilingError
from firstlight.profile.record import (
    ProcessProfile,
    ProfileOptions,
    RegionProfile,
    default_out_dir,
    profile_region,
)
from firstlight.profile.replicas import ReplicaProcess
from firstlight.profile.stacks import (
    DEFAULT_TOP_FRAMES,
    CollapsedStacks,
    FrameTime,
    parse_collapsed,
    render_top_frames,
    top_frames,
)

__all__ = [
    "DEFAULT_TOP_FRAMES",
    "CollapsedStacks",
    "FrameTime",
    "ProcessProfile",
    "ProfileOptions",
    "ProfilingError",
    "RegionProfile",
    "ReplicaProcess",
    "default_out_dir",
    "parse_collapsed",
    "profile_region",
    "render_top_frames",
    "top_frames",
]
