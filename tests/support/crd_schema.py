"""Checks of an object against a CustomResourceDefinition's schema that jsonschema alone does not make."""

from __future__ import annotations

from typing import Any

__all__ = ["undeclared"]


def undeclared(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The fields of `value` that the structural `schema` does not declare — an API server prunes
    them silently, so a field we send and it drops is a bug jsonschema would not see (metadata is
    the API server's own)."""
    if not isinstance(value, dict) or "properties" not in schema or path == ".metadata":
        return []
    found = []
    for key, item in value.items():
        if key not in schema["properties"]:
            found.append(f"{path}.{key}")
        else:
            found += undeclared(item, schema["properties"][key], f"{path}.{key}")
    return found
