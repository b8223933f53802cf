"""An input form generated from the JSON Schema a waiting run declared, and the way back
from the submitted form to typed values.

The form is a convenience; the authority is the schema: whatever the form turns the fields
into is validated by the same use case as `steptrail input` before anything changes. Each
top-level property becomes one field: text (or a select for an `enum`), number, checkbox,
or, for arrays and objects, a JSON text area.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from steptrail.domain.errors import InvalidInput

FIELD_PREFIX = "v."


@dataclass(frozen=True)
class Field:
    """One form field for one top-level property of the schema."""

    name: str
    widget: str  # text | number | integer | checkbox | select | json
    label: str
    required: bool
    description: str | None = None
    choices: tuple[str, ...] = ()
    default: str | None = None

    @property
    def input_name(self) -> str:
        return FIELD_PREFIX + self.name


def fields_for(schema: Mapping[str, Any] | None) -> list[Field]:
    """The fields of a form for `schema` (an object schema; anything else is one JSON area)."""
    schema = schema or {}
    properties = schema.get("properties")
    if schema.get("type", "object") != "object" or not isinstance(properties, Mapping):
        return [Field(name="", widget="json", label="input (JSON object)", required=True)]
    required = set(schema.get("required") or ())
    found = []
    for name, declared in properties.items():
        spec = declared if isinstance(declared, Mapping) else {}
        kind = spec.get("type")
        enum = spec.get("enum")
        if isinstance(enum, list) and all(isinstance(e, str) for e in enum):
            widget, choices = "select", tuple(enum)
        elif kind == "boolean":
            widget, choices = "checkbox", ()
        elif kind in ("integer", "number"):
            widget, choices = str(kind), ()
        elif kind == "string":
            widget, choices = "text", ()
        else:
            widget, choices = "json", ()
        default = spec.get("default")
        found.append(
            Field(
                name=str(name),
                widget=widget,
                label=str(spec.get("title") or name),
                required=name in required,
                description=spec.get("description"),
                choices=choices,
                default=None
                if default is None
                else json.dumps(default)
                if widget == "json"
                else str(default),
            )
        )
    return found


def values_from(fields: list[Field], form: Mapping[str, str]) -> dict[str, Any]:
    """The typed values a submitted form holds. An empty optional field is left out.

    Raises:
        InvalidInput: a number or JSON field does not parse.
    """
    values: dict[str, Any] = {}
    for f in fields:
        raw = form.get(f.input_name)
        if f.widget == "checkbox":
            values[f.name] = raw is not None
            continue
        if raw is None or (raw == "" and not f.required):
            continue
        try:
            if f.widget == "integer":
                values[f.name] = int(raw)
            elif f.widget == "number":
                values[f.name] = float(raw)
            elif f.widget == "json":
                values[f.name] = json.loads(raw)
            else:
                values[f.name] = raw
        except ValueError:
            raise InvalidInput(f"{f.name or 'input'}: {raw!r} is not a valid {f.widget}") from None
    if len(fields) == 1 and fields[0].name == "":
        whole = values.pop("", {})
        if not isinstance(whole, dict):
            raise InvalidInput("input: must be a JSON object")
        return whole
    return values
