"""What every configuration section shares: the frozen base model and the error a
cross-field check raises (it names the field and the value). Private to
:mod:`firstlight.config`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["FieldValueError", "Section"]


class FieldValueError(ValueError):
    """Raised by cross-field validators: names the field (relative to the model being
    validated) and the offending value, so the report can print the full path."""

    def __init__(self, path: str, value: object, message: str) -> None:
        self.path = path
        self.value = value
        self.message = message
        super().__init__(f"{path} = {value!r}: {message}")


class Section(BaseModel):
    """Base of every section: immutable, no unknown keys, attribute docstrings become
    field descriptions (shown by ``firstlight config reference``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
