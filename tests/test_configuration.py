"""The configuration tables in the docs and the declarations in code say the same thing.

Every variable is declared once, beside its field (`agentmesh.config.env`). The README's
configuration table, and the per-service tables it links to, must name each declared variable,
and name no variable the code does not read.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentmesh.config import SERVICE_SECTIONS, ConfigError, Settings, declared_variables, section_class

ROOT = Path(__file__).resolve().parent.parent
# The README's table and the service docs it sends readers to for the rest.
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
NAME = re.compile(r"`((?:AGENTMESH|OTEL|KUBECONFIG)[A-Z0-9_<>]*)`")


def declared() -> set[str]:
    names = {name for name, _, _ in declared_variables(Settings)}
    for service in SERVICE_SECTIONS:
        names |= {name for name, _, _ in declared_variables(section_class(service))}
    return names


def documented() -> dict[str, str]:
    """Variable -> the first doc whose configuration table (a row starting with one) names it."""
    found: dict[str, str] = {}
    for doc in DOCS:
        for line in (ROOT / doc).read_text().splitlines():
            first_cell = line.split("|")[1] if line.startswith("|") and line.count("|") > 2 else ""
            for name in NAME.findall(first_cell):
                for expanded in _expand(name):
                    found.setdefault(expanded, doc)
    return found


def _expand(name: str) -> list[str]:
    if "<SERVICE>" in name:
        return [name.replace("<SERVICE>", service.upper()) for service in SERVICE_SECTIONS]
    return [name]


def test_every_declared_variable_is_documented():
    missing = sorted(declared() - documented().keys())
    assert not missing, f"declared in code but in no configuration table: {missing}"


def test_every_documented_variable_is_declared():
    extra = {name: doc for name, doc in documented().items() if name not in declared()}
    assert not extra, f"documented but read by no code: {extra}"


def test_the_whole_tree_is_built_once_with_each_service_section():
    settings = Settings.from_env({"AGENTMESH_AGENT_MAX_ITERATIONS": "7", "AGENTMESH_SCHEDULER_LOCK": "lease"})
    from agentmesh.agent.settings import AgentSettings
    from agentmesh.scheduler.settings import SchedulerSettings

    assert settings.section(AgentSettings).max_iterations == 7
    assert settings.section(SchedulerSettings).lock == "lease"
    assert not hasattr(settings, "environ")  # nothing keeps the raw environment


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"AGENTMESH_DRAIN_S": "-1"}, "AGENTMESH_DRAIN_S must be at least 0, got -1.0"),
        ({"AGENTMESH_TOOLS_MAX_TIMEOUT_S": "soon"}, "AGENTMESH_TOOLS_MAX_TIMEOUT_S must be a number, got 'soon'"),
        ({"AGENTMESH_MEMORY_DENSE_CONTEXT": "maybe"}, "AGENTMESH_MEMORY_DENSE_CONTEXT must be true or false"),
        ({"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "perhaps"}, "OTEL_EXPORTER_OTLP_TRACES_INSECURE must be true or false"),
    ],
)
def test_a_malformed_variable_of_any_service_stops_start_up_with_its_name(environ, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        Settings.from_env(environ)


def test_the_model_keeps_whether_it_was_named():
    scripted = Settings.from_env({})
    assert scripted.llm.provider == "scripted" and scripted.llm.model_name == "scripted"
    named = Settings.from_env({"AGENTMESH_LLM_MODEL": "qwen3"})
    assert named.llm.model_name == "qwen3"
    served = Settings.from_env({"AGENTMESH_LLM_BASE_URL": "http://127.0.0.1:9/v1/"})
    assert served.llm.provider == "openai" and served.llm.model_name == "llama3.1"
    assert served.llm.endpoint == "http://127.0.0.1:9/v1"


def test_a_tree_without_a_service_section_says_so_instead_of_running_on_defaults():
    from agentmesh.gateway.settings import GatewaySettings

    by_hand = Settings()  # no sections: not what from_env builds
    with pytest.raises(ConfigError, match=r"hold no GatewaySettings section \(loaded: none\).*Settings.from_env\(\)"):
        by_hand.section(GatewaySettings)
    assert Settings.from_env({"AGENTMESH_GATEWAY_MAX_MESSAGE_CHARS": "5000"}).section(GatewaySettings).max_message_chars == 5000


def test_each_default_model_constant_says_which_default_it_is():
    from agentmesh.config import LLMSettings
    from agentmesh.models import DEFAULT_MODEL, catalog_of

    served = Settings.from_env({"AGENTMESH_LLM_BASE_URL": "http://127.0.0.1:9/v1"}).llm
    # The model id asked of the server when none is named, and the catalogue's name of that entry.
    assert served.model_name == LLMSettings.MODEL_ID_WHEN_UNNAMED == "llama3.1"
    assert not hasattr(LLMSettings, "DEFAULT_MODEL")
    default = catalog_of(served).get(DEFAULT_MODEL)
    assert default is not None and (default.name, default.model) == ("default", "llama3.1")


def test_the_model_catalogue_does_not_import_the_configuration():
    # config reads AGENTMESH_MODELS through models; models needs only ConfigError, from errors.
    import subprocess
    import sys

    probe = "import sys, agentmesh.models; print('agentmesh.config' in sys.modules)"
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "False"
