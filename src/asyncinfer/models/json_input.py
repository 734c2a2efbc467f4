"""Inputs validated by a JSON Schema: the ``input_schema`` of a ``python`` catalogue entry.

:func:`json_schema_details` lists every violation as the spec's ``invalid_request`` details
(``{"field": "input.a.0", "message", "type"}``); :func:`json_schema_model` wraps a schema in a
pydantic model, so that code written for the built-in models' pydantic inputs (the worker's
``spec.input_model.model_validate``, ``GET /v1/models``' ``input_schema``) works unchanged.
The validator is jsonschema's for the schema's ``$schema`` (Draft 2020-12 when absent). Where
jsonschema cannot be imported (the API Lambda: its ``rpds-py`` dependency is compiled, so it
cannot be vendored from this machine into an arm64 asset), fastjsonschema is used instead (pure
Python; the Powertools layer's validation extra): it reports the first problem only.
"""

from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def _have_jsonschema() -> bool:
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return False
    return True


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    from jsonschema import validators

    schema = json.loads(schema_json)
    cls = validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@lru_cache(maxsize=256)
def _fast_validator(schema_json: str) -> Any:
    import fastjsonschema

    return fastjsonschema.compile(json.loads(schema_json))


def schema_problem(schema: dict[str, Any]) -> str | None:
    """What makes ``schema`` an invalid JSON Schema, or ``None``.

    Raises:
        ImportError: neither jsonschema nor fastjsonschema is installed.
    """
    if _have_jsonschema():
        from jsonschema import validators
        from jsonschema.exceptions import SchemaError

        try:
            validators.validator_for(schema).check_schema(schema)
        except SchemaError as exc:
            return str(exc.message)
        return None
    import fastjsonschema

    try:
        _fast_validator(json.dumps(schema, sort_keys=True))
    except fastjsonschema.JsonSchemaDefinitionException as exc:
        return str(exc)
    return None


def _extra_keys(subschema: Any, instance: dict[str, Any]) -> list[str]:
    """Keys of ``instance`` that ``additionalProperties: false`` of ``subschema`` refuses."""
    known = subschema.get("properties", {}) if isinstance(subschema, dict) else {}
    patterns = subschema.get("patternProperties", {}) if isinstance(subschema, dict) else {}
    return [
        str(k)
        for k in instance
        if k not in known and not any(re.search(p, str(k)) for p in patterns)
    ]


def _fast_details(schema: dict[str, Any], data: Any, prefix: str) -> list[dict[str, Any]]:
    import fastjsonschema

    try:
        _fast_validator(json.dumps(schema, sort_keys=True))(data)
    except fastjsonschema.JsonSchemaValueException as exc:
        path = [prefix, *(str(p) for p in (exc.path or [])[1:])]
        kind = str(exc.rule or "schema")
        names: list[str] = []
        if kind == "required" and isinstance(exc.value, dict):
            names = [str(r) for r in exc.rule_definition or [] if r not in exc.value][:1]
        elif kind == "additionalProperties" and isinstance(exc.value, dict):
            names = _extra_keys(exc.definition, exc.value)
        message = str(exc.message)
        if exc.name and message.startswith(str(exc.name)):  # "data.top must be ..."
            message = ".".join(path) + message[len(str(exc.name)) :]
        if not names:
            return [{"field": ".".join(path), "message": message, "type": kind}]
        message = "unexpected field" if kind == "additionalProperties" else message
        return [{"field": ".".join([*path, n]), "message": message, "type": kind} for n in names]
    return []


def json_schema_details(
    schema: dict[str, Any], data: Any, prefix: str = "input"
) -> list[dict[str, Any]]:
    """Every violation of ``schema`` by ``data``, as ``details`` entries.

    Args:
        schema: a JSON Schema (checked when the catalogue was loaded).
        data: the JSON value to check.
        prefix: the first part of each ``field`` (``input``).

    Returns:
        ``[{"field": "input.<path>", "message": str, "type": <failed keyword>}]``, in the
        order of the paths; empty when ``data`` is valid. A missing required property is named
        as its own field (``input.prompt``), not as the object holding it.
    """
    if not _have_jsonschema():
        return _fast_details(schema, data, prefix)
    validator = _validator(json.dumps(schema, sort_keys=True))
    out = []
    for err in validator.iter_errors(data):
        path = [prefix, *(str(p) for p in err.absolute_path)]
        kind = str(err.validator)
        names: list[str] = []
        if kind == "required" and isinstance(err.instance, dict):
            names = [str(r) for r in err.validator_value if r not in err.instance][:1]
        elif kind == "additionalProperties" and isinstance(err.instance, dict):
            known = err.schema.get("properties", {}) if isinstance(err.schema, dict) else {}
            patterns = (
                err.schema.get("patternProperties", {}) if isinstance(err.schema, dict) else {}
            )
            names = [
                str(k)
                for k in err.instance
                if k not in known and not any(re.search(p, str(k)) for p in patterns)
            ]
        if not names:
            out.append({"field": ".".join(path), "message": err.message, "type": kind})
        for name in names:
            message = "unexpected field" if kind == "additionalProperties" else err.message
            out.append({"field": ".".join([*path, name]), "message": message, "type": kind})
    return sorted(out, key=lambda d: str(d["field"]))


def json_schema_model(model_id: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A pydantic model that accepts exactly the JSON objects ``schema`` accepts (every key kept
    as an extra field) and publishes ``schema`` as its JSON Schema.

    Raises (from ``model_validate``):
        pydantic.ValidationError: the input breaks the schema (the first problems named).
    """
    published = copy.deepcopy(schema)

    class JsonSchemaInput(BaseModel):
        model_config = ConfigDict(extra="allow", title=f"{model_id} input")

        @model_validator(mode="before")
        @classmethod
        def _check(cls, data: Any) -> Any:
            details = json_schema_details(published, data)
            if details:
                raise ValueError("; ".join(f"{d['field']}: {d['message']}" for d in details[:5]))
            return data

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(published)

    JsonSchemaInput.__name__ = JsonSchemaInput.__qualname__ = f"JsonSchemaInput[{model_id}]"
    return JsonSchemaInput
