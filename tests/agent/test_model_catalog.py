"""AGENTMESH_MODELS parsing: a bad file is a configuration error naming the entry and field."""

from __future__ import annotations

import pytest

from agentmesh.config import ConfigError
from agentmesh.models import ModelSpec, load_catalog

DEFAULT = ModelSpec("default", "openai", "http://127.0.0.1:1/v1", "main")


def test_json_and_yaml_files_give_the_same_catalogue(tmp_path):
    (tmp_path / "m.json").write_text('[{"name": "small", "base_url": "http://h/v1", "model": "s", "fallback": "default"}]')
    (tmp_path / "m.yaml").write_text("models:\n  - {name: small, base_url: 'http://h/v1', model: s, fallback: default}\n")
    for name in ("m.json", "m.yaml"):
        catalog = load_catalog(str(tmp_path / name), DEFAULT)
        assert catalog.names() == ["default", "small"]
        assert catalog.get("small").fallback == "default" and catalog.get("").model == "main"


@pytest.mark.parametrize("text, words", [
    ("[{name: x, base_url: u}]", "model and base_url are required"),
    ("[{name: x, base_url: u, model: m, fallback: nowhere}]", "falls back to 'nowhere', which is not defined"),
    ("[{name: x, base_url: u, model: m}, {name: x, base_url: u, model: n}]", "the name 'x' is taken"),
    ("[{name: x, base_url: u, model: m, provider: bard}]", "provider must be one of"),
    ("[{name: x, base_url: u, model: m, colour: red}]", "unknown field(s) colour"),
    ("[{name: x, base_url: u, model: m, prices: {input_per_mtok: -1}}]", "must not be negative"),
    ("{models: 3}", "must hold a list of models"),
    ("[{name: 'bad name', base_url: u, model: m}]", "name is required"),
])
def test_a_bad_catalogue_is_refused_with_the_reason(tmp_path, text, words):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_catalog(str(path), DEFAULT)
    assert words in str(info.value)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_catalog(str(tmp_path / "nope.yaml"), DEFAULT)


def test_the_models_that_compact_and_reflect_are_settings_checked_at_start(tmp_path):
    from agentmesh.config import LLMSettings
    from agentmesh.models import catalog_of

    path = tmp_path / "m.yaml"
    path.write_text("[{name: small, base_url: 'http://h/v1', model: s, context_window: 8192, vision: true}]")
    llm = LLMSettings.from_env({"AGENTMESH_MODELS": str(path), "AGENTMESH_REFLECTION_MODEL": "small",
                                "AGENTMESH_LLM_CONTEXT_WINDOW": "65536"})
    catalog = catalog_of(llm)
    assert catalog.roles("small") == ["chat", "compaction (own)", "reflection"]
    assert catalog.roles("default") == ["chat", "compaction (own)"]
    assert catalog.get("small").vision and catalog.get("default").context_window == 65536
    with pytest.raises(ConfigError, match="AGENTMESH_COMPACTION_MODEL: 'smal' is not a model this deployment offers"):
        LLMSettings.from_env({"AGENTMESH_MODELS": str(path), "AGENTMESH_COMPACTION_MODEL": "smal"})


def test_a_catalogue_entry_named_default_is_the_default_model(tmp_path):
    from agentmesh.config import LLMSettings
    from agentmesh.models import catalog_of

    path = tmp_path / "m.yaml"
    path.write_text("[{name: default, base_url: 'http://h/v1', model: big, context_window: 131072, temperature: 0.1,"
                    " text_tool_calls: true}]")
    catalog = catalog_of(LLMSettings.from_env({"AGENTMESH_MODELS": str(path), "AGENTMESH_LLM_MODEL": "ignored"}))
    default = catalog.get("")
    assert (default.model, default.context_window, default.temperature, default.text_tool_calls) == (
        "big", 131072, 0.1, True)
    assert catalog.names() == ["default"]
