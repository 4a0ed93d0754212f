"""checkov finds nothing the chart or the Dockerfiles do not explicitly justify.

One checkov run (in its own venv, see ensure_tools.py) scans the default and production renders
and both Dockerfiles, plus copies with every `checkov.io/skip` annotation and `checkov:skip`
comment removed. The originals must have no failed check; the copies must fail exactly the
checks the originals skip, so each justification answers a real finding and hides nothing else.

The file is named to run last in tests/helm: conftest.py starts checkov's one-off install in the
background at collection, and the first test here waits for it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helm.ensure_tools import ToolUnavailable, ensure_checkov_in_background
from tests.helm.helm_support import REPO_ROOT, Rendered

# The one-off install of checkov may take minutes on a slow machine.
# One worker runs the module: its checkov scan (a minute or more) is made once, not per worker.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("checkov")]

DOCKERFILES = {"services": REPO_ROOT / "docker" / "Dockerfile", "sandbox": REPO_ROOT / "docker" / "sandbox" / "Dockerfile",
               "data": REPO_ROOT / "docker" / "sandbox-data" / "Dockerfile"}
CONFIGS = ("default", "production")


def _without_skip_annotations(obj: dict) -> dict:
    annotations = obj.get("metadata", {}).get("annotations") or {}
    for key in [k for k in annotations if k.startswith("checkov.io/skip")]:
        del annotations[key]
    return obj


def _write_render(rendered: Rendered, directory: Path, strip: bool) -> None:
    directory.mkdir(parents=True)
    for i, obj in enumerate(rendered.objects):
        obj = json.loads(json.dumps(obj))  # a copy
        if strip:
            obj = _without_skip_annotations(obj)
        (directory / f"{i:03d}-{obj['kind'].lower()}.yaml").write_text(yaml.safe_dump(obj, sort_keys=False))


def _write_dockerfile(source: Path, directory: Path, strip: bool) -> None:
    directory.mkdir(parents=True)
    text = source.read_text()
    if strip:
        text = re.sub(r"^#\s*checkov:skip=.*\n", "", text, flags=re.M)
    (directory / "Dockerfile").write_text(text)


@pytest.fixture(scope="module")
def checkov_results(tmp_path_factory, default_render, production_render) -> dict[str, dict[str, list[dict]]]:
    """{'passed'|'failed'|'skipped': [check result, ...]} keyed by the scanned sub-directory."""
    try:
        checkov = ensure_checkov_in_background().result(timeout=900)
    except ToolUnavailable as exc:
        pytest.fail(str(exc))
    root = tmp_path_factory.mktemp("checkov")
    renders = {"default": default_render, "production": production_render}
    for variant, strip in (("as-shipped", False), ("unskipped", True)):
        for name, rendered in renders.items():
            _write_render(rendered, root / variant / name, strip)
        for name, path in DOCKERFILES.items():
            _write_dockerfile(path, root / variant / f"docker-{name}", strip)
    result = subprocess.run(
        [str(checkov), "--directory", str(root), "--framework", "kubernetes", "dockerfile",
         "--output", "json", "--compact", "--skip-download", "--soft-fail", "--no-fail-on-crash"],
        capture_output=True, text=True, timeout=600,
        env={"PATH": "/usr/bin:/bin", "HOME": str(root), "LOG_LEVEL": "ERROR"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert {r["check_type"] for r in reports} == {"kubernetes", "dockerfile"}, result.stdout[:2000]
    by_dir: dict[str, dict[str, list[dict]]] = {}
    for report in reports:
        assert report["results"].get("parsing_errors", []) == []
        for outcome in ("passed", "failed", "skipped"):
            for check in report["results"].get(f"{outcome}_checks", []):
                directory = "/".join(Path(check["file_path"]).parts[1:3])  # e.g. as-shipped/default
                by_dir.setdefault(directory, {"passed": [], "failed": [], "skipped": []})[outcome].append(check)
    return by_dir


SCANNED = [f"{variant}/{name}" for variant in ("as-shipped",) for name in (*CONFIGS, "docker-services", "docker-sandbox", "docker-data")]


@pytest.mark.parametrize("directory", SCANNED)
def test_checkov_finds_no_unjustified_failure(checkov_results, directory):
    results = checkov_results[directory]
    assert len(results["passed"]) > (50 if "docker" not in directory else 20), "checkov did not scan much: is the output format still the same?"
    failures = [f"{c['check_id']} {c['check_name']} on {c['resource']}" for c in results["failed"]]
    assert failures == []


@pytest.mark.parametrize("directory", SCANNED)
def test_every_skip_is_justified_and_needed(checkov_results, directory):
    skipped = checkov_results[directory]["skipped"]
    for check in skipped:
        reason = (check.get("check_result") or {}).get("suppress_comment", "").strip()
        assert len(reason) >= 30 and reason != "No comment provided", f"{check['check_id']}: {reason!r}"
    unskipped = checkov_results[directory.replace("as-shipped", "unskipped")]["failed"]
    def key(check: dict) -> tuple[str, str]:
        # Dockerfile results are named by path (a failed one with the instruction after it, a skipped
        # one without); the two copies differ only in the variant dir.
        resource = re.sub(r"/Dockerfile\..*$", "/Dockerfile", check["resource"])
        return check["check_id"], resource.replace("/unskipped/", "/as-shipped/")

    assert sorted(map(key, unskipped)) == sorted(map(key, skipped))


def test_workloads_were_actually_checked(checkov_results):
    """Guard against a scan that silently skipped our objects."""
    passed = checkov_results["as-shipped/default"]["passed"]
    checked = {c["resource"] for c in passed if c["check_id"] == "CKV_K8S_20"}  # allowPrivilegeEscalation
    assert {r.split(".")[-1] for r in checked} >= {
        "agentmesh-gateway", "agentmesh-agent", "agentmesh-tools", "agentmesh-memory", "agentmesh-scheduler", "agentmesh-qdrant"
    }
