"""Firstlight: multi-region LLM serving routed by predicted time to first token.

The public surface is re-exported here; subsystems live in their own packages
(``config``, ``engine``, and later ``routing``, ``hints``, ``serve``, ``api``,
``regions``, ``telemetry``).
"""

from importlib.metadata import PackageNotFoundError, version

from firstlight.config import PlatformConfig, load_config
from firstlight.errors import ConfigError, FirstlightError, ModelPreparationError

try:
    __version__ = version("firstlight")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "ConfigError",
    "FirstlightError",
    "ModelPreparationError",
    "PlatformConfig",
    "__version__",
    "load_config",
]
