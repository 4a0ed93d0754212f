"""The storage port is split by what is stored, and each part has its own conformance suite.

`agentmesh.memory.ports.Store` is exactly its small ports — sessions, transcript messages,
namespace settings, long-term memories kept and searched, usage records, the life cycle — with no
method in two of them and none large; each small port's suite (run against every adapter,
store_adapters.py) calls every method of its port, so a method added to a port without a case
fails here.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from agentmesh.memory import ports

HERE = Path(__file__).parent
# Each small port, and the suite that holds it to its contract against every adapter.
SUITES = {
    ports.StoreLifecycle: "test_store_lifecycle_port.py",
    ports.SessionStore: "test_session_port.py",
    ports.MessageStore: "test_message_port.py",
    ports.NamespaceSettingsStore: "test_namespace_settings_port.py",
    ports.MemoryStore: "test_memory_port.py",
    ports.MemorySearch: "test_memory_port.py",
    ports.UsageStore: "test_usage_port.py",
}
MOST_METHODS = 7


def _methods(port: type) -> set[str]:
    """The methods a protocol declares itself (not those of the ports it is made of)."""
    return {name for name, value in vars(port).items() if inspect.isfunction(value) and not name.startswith("_")}


def _all_methods(port: type) -> set[str]:
    return {name for klass in port.__mro__ if klass is not object for name in _methods(klass)}


def test_the_store_is_exactly_its_small_ports_each_small_and_apart():
    seen: dict[str, type] = {}
    for port in SUITES:
        methods = _methods(port)
        assert 0 < len(methods) <= MOST_METHODS, (port.__name__, sorted(methods))
        for name in methods:
            assert name not in seen, f"{name} is in both {seen[name].__name__} and {port.__name__}"
            seen[name] = port
    assert set(seen) == _all_methods(ports.Store)
    assert _methods(ports.Store) == set()  # nothing of its own: only the small ports
    # The cores' compositions are made of small ports only.
    assert _all_methods(ports.TranscriptStore) == _methods(ports.SessionStore) | _methods(ports.MessageStore)
    assert _all_methods(ports.LongTermStore) == _methods(ports.MemoryStore) | _methods(ports.MemorySearch)


def test_each_small_port_has_a_suite_that_calls_every_method_against_every_adapter():
    for port, suite in SUITES.items():
        text = (HERE / suite).read_text()
        assert "store_factory" in text, f"{suite} does not run against the adapters (store_factory)"
        missing = [name for name in sorted(_methods(port)) if f".{name}(" not in text]
        assert not missing, f"{suite} calls no {', '.join(missing)} of {port.__name__}"


def test_the_agent_port_has_a_suite_that_calls_every_method_against_both_document_adapters():
    # AgentStore is implemented by the document adapters (agent_records.py), not by `Store`.
    text = (HERE / "test_agent_port.py").read_text()
    assert "documents_factory" in text
    missing = [name for name in sorted(_methods(ports.AgentStore)) if f".{name}(" not in text]
    assert not missing, f"test_agent_port.py calls no {', '.join(missing)} of AgentStore"
    assert len(_methods(ports.AgentStore)) <= MOST_METHODS
