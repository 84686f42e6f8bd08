"""The base of the models of the JSON files the toolkit writes and reads back
(``summary.json``, ``point.json``, ``sweep.json``, ``kept.json``): some keys exist only
where they apply, and are written only then.

A model lists those keys in ``ABSENT_UNLESS_SET``: they are written only when given
(or read), so a file says nothing rather than ``"key": null`` where the key does not
apply. Each file's base (summary.py `_Doc`, sweep.py `_Record`) adds its own
configuration.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


class Document(BaseModel):
    """A part of a JSON file whose ``ABSENT_UNLESS_SET`` keys are written only when set."""

    ABSENT_UNLESS_SET: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for key in self.ABSENT_UNLESS_SET - self.model_fields_set:
                data.pop(key, None)
            data = self._ordered(data)
        return data

    def _ordered(self, data: dict[str, Any]) -> dict[str, Any]:
        """The written key order, when it is not the fields' (summary.py `DelayLineWindow`)."""
        return data
