"""The namespace-settings port (agentmesh.memory.ports.NamespaceSettingsStore), against every
adapter (store_adapters.py): a namespace's settings read as last written, apart from every other
namespace's, while open and after a reopen."""

from __future__ import annotations


async def test_settings_are_put_replaced_kept_apart_and_there_after_a_reopen(store_factory):
    store = await store_factory()
    assert await store.get_namespace_settings("team") is None
    first = {"namespace": "team", "tools_allow": [], "tools_deny": ["shell"], "updated_at": 1.0}
    await store.put_namespace_settings(first)
    assert await store.get_namespace_settings("team") == first
    changed = {"namespace": "team", "tools_allow": ["read_file"], "tools_deny": [], "updated_at": 2.0,
               "mcp_servers_version": 3.0}
    await store.put_namespace_settings(changed)  # replaced whole, not merged
    other = {"namespace": "team-b", "tools_allow": [], "tools_deny": ["python"], "updated_at": 1.5}
    await store.put_namespace_settings(other)
    assert await store.get_namespace_settings("team") == changed
    assert await store.get_namespace_settings("team-b") == other
    # Settings are not sessions: a session of the same name is another record.
    await store.put_session({"session_id": "team", "created_at": 1.0})
    store = await store_factory.reopen(store)
    assert await store.get_namespace_settings("team") == changed
    assert await store.get_namespace_settings("team-b") == other
    assert await store.get_namespace_settings("team-c") is None


async def test_a_namespaces_models_are_kept_as_written_nested_fields_and_all(store_factory):
    """Its own models (ModelConfig resources) are a list of mappings in the record: every adapter
    gives them back as written, the key's Secret reference included, after a reopen too."""
    store = await store_factory()
    models = [{"name": "own", "provider": "openai", "model": "gpt-x", "base_url": "https://llm.example/v1",
               "context_window": 8192, "temperature": 0.3, "no_vision": True,
               "api_key_secret": "team-llm", "api_key_secret_key": "api-key"},
              {"name": "second", "provider": "anthropic", "model": "claude-x", "fallback": "own"}]
    record = {"namespace": "team", "tools_allow": [], "tools_deny": [], "updated_at": 1.0, "models": models}
    await store.put_namespace_settings(record)
    assert await store.get_namespace_settings("team") == record
    store = await store_factory.reopen(store)
    assert (await store.get_namespace_settings("team"))["models"] == models
