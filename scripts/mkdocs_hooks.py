"""MkDocs hooks: the HTTP API reference is rendered from the OpenAPI document when the site is built.

The document is the one the service serves (api/openapi.py, built with the settings' defaults), so the
reference page and a copy of openapi.json cannot drift from the code; neither is committed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
PAGE = "guide/api-reference.md"
DOCUMENT = "guide/openapi.json"
Schema = dict[str, Any]


def _openapi() -> dict[str, Any]:
    """Return the OpenAPI document the service serves with default settings."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # mkdocs runs from its own bin directory
    from api.openapi import build_document
    from core.settings import Settings

    return build_document(Settings.model_construct())


def _type(schema: Schema) -> str:
    """Return a schema's type as a cell shows it."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(option) for option in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    if schema.get("type") == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"map to {_type(schema['additionalProperties'])}"
    return str(schema.get("type", "any"))


def _bounds(schema: Schema) -> str:
    """Return a schema's limits as a short note."""
    options = [schema, *schema.get("anyOf", [])]
    notes = [
        f"{label} {option[key]}"
        for option in options
        for key, label in (("minimum", "≥"), ("maximum", "≤"), ("minLength", "length ≥"), ("maxLength", "length ≤"))
        if key in option
    ]
    return f" ({', '.join(notes)})" if notes else ""


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _operation(path: str, method: str, operation: Schema) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", "", _cell(operation.get("summary", "")), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type |", "|---|---|---|"]
        for parameter in parameters:
            schema = parameter.get("schema", {})
            lines.append(f"| `{parameter['name']}` | {parameter['in']} | {_type(schema)}{_bounds(schema)} |")
        lines.append("")
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body:
        lines += [f"Body: {_type(body)}.", ""]
    answers, errors = [], []
    for status, response in operation.get("responses", {}).items():
        content = response.get("content", {})
        schema = next((c["schema"] for c in content.values() if "schema" in c), None)
        shown = _type(schema) if schema and "$ref" in schema else ", ".join(content) or response["description"]
        if shown == _type({"$ref": "#/components/schemas/ErrorBody"}):
            errors.append(status)
        else:
            answers.append(f"**{status}** {shown}")
    if errors:
        answers.append(f"errors {', '.join(errors)} as {_type({'$ref': '#/components/schemas/ErrorBody'})}")
    lines += ["Answers: " + "; ".join(answers) + ".", ""]
    return lines


def _schema(name: str, schema: Schema) -> list[str]:
    lines = [f"### {name}", "", _cell(schema.get("description", "")), ""]
    if "enum" in schema:
        lines += [f"One of {_type(schema)}.", ""]
    properties = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", []))
        lines += ["| field | type | default | |", "|---|---|---|---|"]
        for field, spec in properties.items():
            default = "required" if field in required else f"`{json.dumps(spec.get('default'))}`"
            lines.append(
                f"| `{field}` | {_type(spec)}{_bounds(spec)} | {default} | {_cell(spec.get('description', ''))} |"
            )
        lines.append("")
    return lines


def render(document: dict[str, Any]) -> str:
    """Return the reference page: every route, then every schema."""
    lines = [
        "# API reference",
        "",
        "<!-- Rendered from the OpenAPI document (api/openapi.py, api/contract.py) when the site is built. -->",
        "",
        f"{_cell(document['info']['description'])} The document itself: [openapi.json](openapi.json), as the "
        "service serves it at `/openapi.json` with default settings. How to use the routes: [HTTP API](http-api.md).",
        "",
        "## Routes",
        "",
    ]
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            lines += _operation(path, method, operation)
    lines += ["## Schemas", ""]
    for name, schema in sorted(document["components"]["schemas"].items()):
        lines += _schema(name, schema)
    return "\n".join(lines)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the API reference page and openapi.json to the site."""
    document = _openapi()
    files.append(File.generated(config, PAGE, content=render(document)))
    files.append(File.generated(config, DOCUMENT, content=json.dumps(document, indent=1) + "\n"))
    return files
