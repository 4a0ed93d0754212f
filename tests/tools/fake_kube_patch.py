"""PATCH of a pod for the tests' Kubernetes API server (fake_kube.py): a JSON merge patch (RFC 7386),
applied only to the `metadata.resourceVersion` it carries when it carries one (409 Conflict
otherwise), as the API server's optimistic concurrency does; the pod as the patch leaves it is
validated against the OpenAPI schema (422 when invalid)."""

from __future__ import annotations

import json

import kubernetes_validate

from tests.tools.fake_kube import K8S_VERSION, public, status_body

__all__ = ["merge_patch", "serve_patch"]


def serve_patch(fake, handler, parts, raw) -> None:
    key = (parts[3], parts[5])
    content_type = handler.headers.get("Content-Type", "")
    if content_type.split(";")[0].strip() != "application/merge-patch+json":
        fake.answer(handler, 415, status_body(415, "UnsupportedMediaType", f"the tests' API server takes merge patches only, not {content_type}"))
        return
    patch = json.loads(raw or b"{}")
    fake.patches.append(patch)
    with fake.cond:
        pod = fake.pods.get(key)
        if pod is None:
            fake.answer(handler, 404, status_body(404, "NotFound", f'pods "{parts[5]}" not found'))
            return
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != pod["metadata"].get("resourceVersion"):
            fake.answer(handler, 409, status_body(409, "Conflict", f'Operation cannot be fulfilled on pods "{parts[5]}": the object has been modified; please apply your changes to the latest version and try again'))
            return
        merged = merge_patch(json.loads(json.dumps(public(pod))), patch)
        try:
            kubernetes_validate.validate({k: v for k, v in merged.items() if k != "status"}, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            fake.invalid.append(str(exc))
            fake.answer(handler, 422, status_body(422, "Invalid", f"Pod is invalid: {exc}"))
            return
        pod["metadata"] = merged["metadata"]
        fake._emit("MODIFIED", key)  # noqa: SLF001 - the API server's own event, as its other handlers emit it
        answer = public(pod)
    fake.answer(handler, 200, answer)


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target
