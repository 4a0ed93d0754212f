"""AGENTMESH_MODELS parsing: a bad file is a configuration error naming the entry and field."""

from __future__ import annotations

import pytest

from agentmesh.config import ConfigError, Settings
from agentmesh.logs import secrets_of
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
    ("[{name: x, base_url: u, model: m, max_concurrency: many}]", "(x): max_concurrency must be a whole number"),
    ("[{name: x, base_url: u, model: m, max_concurrency: -1}]", "from 0 (no limit) to 1000000, got -1"),
    ("[{name: x, base_url: u, model: m, max_concurrency: 2.5}]", "got 2.5"),
    ("[{name: x, base_url: u, model: m, max_concurrency: true}]", "got True"),
    ("[{name: x, base_url: u, model: m, max_concurrency: 1000001}]", "max_concurrency must be a whole number"),
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


def test_max_concurrency_is_read_per_model_and_unset_means_the_deployment_default(tmp_path):
    (tmp_path / "m.yaml").write_text("[{name: a, base_url: u, model: m, max_concurrency: 3},"
                                     " {name: b, base_url: u, model: m, max_concurrency: 0}, {name: c, base_url: u, model: m}]")
    catalog = load_catalog(str(tmp_path / "m.yaml"), DEFAULT)
    assert [catalog.get(n).max_concurrency for n in "abc"] == [3, 0, None]


def test_the_deployment_default_is_a_setting_with_a_clear_error(tmp_path):
    assert Settings.from_env({"AGENTMESH_HOME": str(tmp_path)}).llm.max_concurrency == 1024
    assert Settings.from_env({"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_LLM_MAX_CONCURRENCY": "0"}).llm.max_concurrency == 0
    for bad in ("-1", "lots"):
        with pytest.raises(ConfigError, match="AGENTMESH_LLM_MAX_CONCURRENCY"):
            Settings.from_env({"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_LLM_MAX_CONCURRENCY": bad})


def test_catalogue_keys_are_secrets_the_log_redactor_masks(tmp_path):
    (tmp_path / "m.yaml").write_text("[{name: a, base_url: u, model: m, api_key_env: A_KEY}]")
    settings = Settings.from_env({"AGENTMESH_HOME": str(tmp_path), "AGENTMESH_MODELS": str(tmp_path / "m.yaml"),
                                  "A_KEY": "sk-catalogue-key-12345"})
    assert "sk-catalogue-key-12345" in secrets_of(settings)
    assert "sk-catalogue-key-12345" not in repr(settings.llm.models)


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
