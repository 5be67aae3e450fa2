"""JSON Schema validation that reports errors as ``{pointer, message}``.

Param, option and config schemas are plain JSON Schema (draft 2020-12) so the
same dictionaries validate requests and appear in ``/openapi.json``.
Integers are strict: ``1.0`` and ``true`` are not integers here.
"""

from __future__ import annotations

import copy
from typing import Any

from jsonschema import Draft202012Validator, validators

from svc.errors import FieldError, pointer


def _is_strict_integer(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_strict_number(checker: Any, instance: Any) -> bool:
    return isinstance(instance, (int, float)) and not isinstance(instance, bool)


_TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER.redefine_many(
    {"integer": _is_strict_integer, "number": _is_strict_number}
)
StrictValidator = validators.extend(Draft202012Validator, type_checker=_TYPE_CHECKER)


class ObjectSchema:
    """A compiled object schema with pointer-style errors and defaults."""

    def __init__(self, schema: dict, what: str = "field") -> None:
        StrictValidator.check_schema(schema)
        self.schema = schema
        self.what = what
        self._validator = StrictValidator(schema)
        self.properties: dict = schema.get("properties", {})
        self.defaults = {k: v["default"] for k, v in self.properties.items() if "default" in v}

    def errors(self, instance: Any, *base: object) -> list[FieldError]:
        """Every problem of ``instance``, each with its JSON pointer."""
        found: list[FieldError] = []
        for err in self._validator.iter_errors(instance):
            where = [*base, *err.absolute_path]
            if err.validator == "additionalProperties" and isinstance(err.instance, dict):
                allowed = sorted(err.schema.get("properties", {}))
                for key in sorted(set(err.instance) - set(allowed)):
                    names = ", ".join(allowed) if allowed else "none"
                    found.append(FieldError(pointer(*where, key), f"unknown {self.what} '{key}'; accepted: {names}"))
            else:
                found.append(FieldError(pointer(*where), err.message))
        found.sort(key=lambda e: e.pointer)
        return found

    def with_defaults(self, instance: dict) -> dict:
        """``instance`` completed with the schema's top-level defaults."""
        return {**copy.deepcopy(self.defaults), **instance}


def object_schema(properties: dict, *, description: str = "") -> dict:
    """A closed object schema (``additionalProperties: false``)."""
    schema = {"type": "object", "additionalProperties": False, "properties": properties}
    if description:
        schema["description"] = description
    return schema


def compile_schema(schema: dict) -> Any:
    """A strict validator for any schema (for example a ``data`` schema)."""
    StrictValidator.check_schema(schema)
    return StrictValidator(schema)
