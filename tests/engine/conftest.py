"""Engine fixtures: ``prepared`` (the default model, converted once per session) lives in
the root conftest, shared with the serving tests; these names are re-exported for the
engine tests that import them from here."""

from __future__ import annotations

from tests.conftest import MODEL, Prepared, prepare_with_cli

__all__ = ["MODEL", "Prepared", "prepare_with_cli"]
