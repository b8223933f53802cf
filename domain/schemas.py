"""Input schemas a run declares: checked when declared, applied with bounds (ADR 0020).

A run waiting for input declares a JSON Schema, and the schema may come from a request, so it
is hostile input like any other. The rules:

* **Checked when declared** (`check_schema`): a JSON object of at most `MAX_SCHEMA_BYTES`
  and `MAX_DEPTH` levels, valid against its dialect's meta-schema (a `$schema` steptrail does
  not know is refused), every pattern compiles, and every `$ref` / `$dynamicRef` /
  `$recursiveRef` is local (`#…`). No `file:`, no `http:`, no relative URL: a schema can
  never make steptrail read a file or open a connection.
* **Resolved locally only**: validation uses a `referencing` registry whose retrieval refuses
  everything, so even a reference that slipped past the check resolves to nothing.
* **Bounded in time**: regular expressions (`pattern`, `patternProperties`, and the
  `additionalProperties` that depends on them) run on the `regex` library with a timeout
  drawn from one budget of `VALIDATION_BUDGET_S` per validation; every other keyword checks
  the budget before it runs; `uniqueItems` is linear. Input that exhausts the budget is
  refused as invalid, and nothing changes. `unevaluatedProperties` together with
  `patternProperties` is refused at declaration (jsonschema evaluates that pair with the
  standard `re` module, which cannot be bounded).

The clock is an argument (`clock`), as everywhere in the domain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from steptrail.domain.digest import canonical_json
from steptrail.domain.errors import InvalidInput
from steptrail.domain.limits import MAX_DEPTH, PayloadRejected, check_depth

MAX_SCHEMA_BYTES = 65_536
VALIDATION_BUDGET_S = 1.0
REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
MAX_MESSAGE = 300


class InvalidSchema(ValueError):
    """A declared input schema is refused (invalid, non-local reference, too large)."""


class _OutOfTime(Exception):
    pass


_UNKNOWN: Any = object()  # what validator_for returns for a $schema it does not know


def _dicts(value: Any) -> Iterator[Mapping[str, Any]]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def check_schema(schema: Any) -> dict[str, Any]:
    """`schema`, if steptrail will validate input against it (see the module docstring).

    Raises:
        InvalidSchema: saying why it is refused.
    """
    if not isinstance(schema, Mapping):
        raise InvalidSchema("an input schema must be a JSON object")
    try:
        check_depth(schema, "the input schema")
        size = len(canonical_json(schema))
    except PayloadRejected as error:
        raise InvalidSchema(str(error)) from None
    except (TypeError, ValueError) as error:
        raise InvalidSchema(f"the input schema is not JSON: {error}") from None
    if size > MAX_SCHEMA_BYTES:
        raise InvalidSchema(
            f"the input schema is {size:,} bytes; the limit is {MAX_SCHEMA_BYTES:,}"
        )
    import jsonschema  # here, not at the top: a command that never checks input never pays
    import regex  # for jsonschema and regex (ADR 0043)

    uses_patterns = uses_unevaluated = False
    for node in _dicts(schema):
        for key in REF_KEYS:
            ref = node.get(key)
            if isinstance(ref, str) and not ref.startswith("#"):
                raise InvalidSchema(
                    f"the input schema refers outside itself ({key} {ref[:80]!r}); "
                    "only local references (#…) are allowed"
                )
        for pattern in _patterns(node):
            try:
                regex.compile(pattern)
            except (regex.error, TypeError) as error:
                raise InvalidSchema(f"the input schema has an invalid pattern: {error}") from None
        uses_patterns = uses_patterns or "patternProperties" in node
        uses_unevaluated = uses_unevaluated or "unevaluatedProperties" in node
    if uses_patterns and uses_unevaluated:
        raise InvalidSchema(
            "an input schema may not combine patternProperties with unevaluatedProperties"
        )
    cls = _dialect(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as error:
        raise InvalidSchema(f"the input schema is invalid: {error.message[:MAX_MESSAGE]}") from None
    return dict(schema)


def _patterns(node: Mapping[str, Any]) -> list[Any]:
    found = []
    if isinstance(node.get("pattern"), str):
        found.append(node["pattern"])
    properties = node.get("patternProperties")
    if isinstance(properties, Mapping):
        found.extend(properties)
    return found


def _dialect(schema: Mapping[str, Any]) -> type[Any]:
    import jsonschema
    from jsonschema import validators

    if "$schema" in schema:
        cls: Any = validators.validator_for(schema, default=_UNKNOWN)
        if cls is _UNKNOWN:
            raise InvalidSchema(f"unknown JSON Schema dialect {str(schema['$schema'])[:80]!r}")
        return cls  # type: ignore[no-any-return]
    return jsonschema.Draft202012Validator


def _refuse(uri: str) -> Any:
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(uri)


class _Budget:
    def __init__(self, clock: Callable[[], float], seconds: float) -> None:
        self.clock = clock
        self.end = clock() + seconds

    def left(self) -> float:
        left = self.end - self.clock()
        if left <= 0:
            raise _OutOfTime
        return left

    def search(self, pattern: str, text: str) -> bool:
        import regex

        try:
            return regex.search(pattern, text, timeout=self.left()) is not None
        except TimeoutError:
            raise _OutOfTime from None


def _bounded(base: type[Any], budget: _Budget) -> type[Any]:
    """`base` with every keyword checking the budget, and the regex keywords timed."""
    from jsonschema import validators
    from jsonschema.exceptions import ValidationError

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not budget.search(patrn, instance):
            yield ValidationError(f"{instance[:80]!r} does not match {patrn[:80]!r}")

    def pattern_properties(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in value.items():
            for k, v in instance.items():
                if budget.search(patrn, k):
                    yield from validator.descend(v, subschema, path=k, schema_path=patrn)

    def additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        declared = schema.get("properties", {})
        patterns = list(schema.get("patternProperties", {}))
        extras = [
            k
            for k in instance
            if k not in declared and not any(budget.search(p, k) for p in patterns)
        ]
        if validator.is_type(ap, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], ap, path=extra)
        elif not ap and extras:
            shown = ", ".join(repr(e[:40]) for e in sorted(extras)[:5])
            yield ValidationError(f"additional properties are not allowed ({shown})")

    def unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
        if unique and validator.is_type(instance, "array"):
            seen: set[bytes] = set()
            for item in instance:
                key = canonical_json(_normal(item))
                if key in seen:
                    yield ValidationError("the array has non-unique elements")
                    return
                seen.add(key)

    def timed(keyword: Callable[..., Any]) -> Callable[..., Any]:
        def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
            budget.left()
            result = keyword(validator, value, instance, schema)
            return result if result is not None else ()

        return run

    replaced: dict[str, Callable[..., Any]] = {
        **{k: timed(v) for k, v in base.VALIDATORS.items()},
        "pattern": pattern,
        "patternProperties": pattern_properties,
        "additionalProperties": additional_properties,
        "uniqueItems": unique_items,
    }
    extended: type[Any] = validators.extend(base, replaced)  # type: ignore[no-untyped-call]
    return extended


def _normal(value: Any) -> Any:
    # JSON Schema equality: 1 and 1.0 are equal, true and 1 are not.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _normal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    return value


def validate_input(
    schema: Mapping[str, Any],
    values: Mapping[str, Any],
    *,
    clock: Callable[[], float],
    budget_s: float = VALIDATION_BUDGET_S,
) -> dict[str, Any]:
    """The declared keys of `values`, once they satisfy `schema`.

    Raises:
        InvalidInput: the values do not satisfy the schema, took longer than `budget_s` to
            check, or the schema itself is refused (nothing may change then).
    """
    try:
        checked = check_schema(schema)
    except InvalidSchema as error:
        raise InvalidInput(f"the run declared a schema steptrail refuses: {error}") from None
    from referencing import Registry
    from referencing.exceptions import Unresolvable

    budget = _Budget(clock, budget_s)
    cls = _bounded(_dialect(checked), budget)
    validator = cls(checked, registry=Registry(retrieve=_refuse))  # type: ignore[call-arg]
    try:
        first = next(iter(validator.iter_errors(dict(values))), None)
    except _OutOfTime:
        raise InvalidInput(
            f"checking the input against the run's schema took over {budget_s:g} s "
            "(a pattern too costly for this input); nothing changed"
        ) from None
    except RecursionError:
        raise InvalidInput("the run's schema refers to itself without end") from None
    except Unresolvable as wrapped:
        raise InvalidInput(f"the run's schema has an unresolvable reference: {wrapped}") from None
    if first is not None:
        where = "/".join(str(p) for p in first.absolute_path) or "input"
        raise InvalidInput(f"{where[:80]}: {first.message[:MAX_MESSAGE]}")
    declared = checked.get("properties")
    if isinstance(declared, Mapping):
        return {k: v for k, v in values.items() if k in declared}
    return dict(values)


__all__ = ["MAX_DEPTH", "InvalidSchema", "check_schema", "validate_input"]
