"""The Firstlight exception tree.

Every error the platform raises on purpose derives from :class:`FirstlightError`, so a
caller (the CLI, the gateway) can tell our errors from bugs. Third-party exceptions are
translated at the boundary that calls the library, with ``raise ... from exc``::

    FirstlightError
    ├── ConfigError               configuration file, value or environment override is invalid
    └── ModelPreparationError     the default model cannot be located, converted or verified

Later subsystems add their branches here (routing, hints, engines, API errors), so the
whole tree stays readable in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConfigError", "ConfigProblem", "FirstlightError", "ModelPreparationError"]


class FirstlightError(Exception):
    """Base class of every error Firstlight raises deliberately."""


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration.

    ``path`` is the field's dotted path with list indices (``regions[1].peers[0].region``),
    empty for problems with the document as a whole; ``value`` is the offending input
    (``None`` when there is none, e.g. a missing field).
    """

    path: str
    message: str
    value: object = None
    has_value: bool = False

    def __str__(self) -> str:
        where = self.path or "<config>"
        if self.has_value:
            return f"{where} = {self.value!r}: {self.message}"
        return f"{where}: {self.message}"


class ConfigError(FirstlightError):
    """A configuration could not be loaded; ``problems`` lists every issue found.

    Raised by :func:`firstlight.config.load_config` and
    :func:`firstlight.config.parse_config`; the CLI prints each problem and exits 2.
    """

    def __init__(self, problems: list[ConfigProblem], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        head = f"invalid configuration in {source}" if source else "invalid configuration"
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{head}:\n{lines}")


class ModelPreparationError(FirstlightError):
    """The default model could not be located, converted or verified.

    Raised by :func:`firstlight.engine.default_model.prepare_default_model`; the message
    says what to install or delete to fix it.
    """
