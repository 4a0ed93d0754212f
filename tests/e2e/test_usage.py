"""Usage accounting end to end: every model call the scripted servers answer — a deep turn's plan,
its steps, a sub-agent's calls, a compaction summary, a fallback's answer — is recorded by the
agent in the memory service's ledger, and `Gateway.GetUsage` (and `agentmesh usage`) sums it to
exactly what the servers reported; the ledger survives a restart of every service."""

from __future__ import annotations

import dataclasses
import json
import time

import grpc
import pytest

from agentmesh.agent.capabilities.compaction import INSTRUCTION
from agentmesh.v1 import gateway_pb2
from tests.e2e.conftest import chat, collect, of_kind, rpc_error, wait_until
from tests.e2e.test_deep_work import model as deep_model
from tests.e2e.test_tenants import tenants  # noqa: F401 - the two-tenant stack fixture
from tests.support.llm_server import ScriptedLLMServer, failure, reply
from tests.support.stack import Stack

# Compaction past 3 000 characters; delegation in default turns too; task board off (free-text plan).
ENV = {"AGENTMESH_AGENT_COMPACT_AT_CHARS": "3000", "AGENTMESH_AGENT_COMPACT_KEEP_CHARS": "1000",
       "AGENTMESH_AGENT_RECALL_K": "0", "AGENTMESH_AGENT_TASK_MODES": "none", "AGENTMESH_LLM_MAX_RETRIES": "1"}


def with_usage(answer):
    """`answer`, each reply reporting its own usage (different for every call, cached tokens too),
    so that a call counted twice or missed changes the sums."""

    def step(request):
        r = answer(request)
        n = request.index
        return dataclasses.replace(r, usage=(1000 + 37 * n, 50 + 11 * n), cached_tokens=3 * n)

    return step


def deep_or_summary(request):
    if request.messages[0]["content"] == INSTRUCTION:
        return reply("SUMMARY: the earlier turns were padding.")
    if "padding" in request.messages[-1]["content"]:
        return reply("noted")
    return deep_model(request)


@pytest.fixture
def priced():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def flaky():
    with ScriptedLLMServer(default=failure(503)) as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm, priced, flaky):
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"""
models:
  - name: priced
    base_url: {priced.base_url}
    model: priced-model
    prices: {{input_per_mtok: 2.0, output_per_mtok: 8.0}}
  - name: flaky
    base_url: {flaky.base_url}
    model: flaky-model
    fallback: priced
""")
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url,
                     env={**ENV, "AGENTMESH_MODELS": str(catalog)}) as running:
        yield running


async def usage(gateway, **fields) -> gateway_pb2.GetUsageResponse:
    return await gateway.GetUsage(gateway_pb2.GetUsageRequest(**fields), timeout=10)


def sums(reported) -> tuple[int, int, int, int]:
    return (len(reported), sum(r[0] for r in reported), sum(r[1] for r in reported), sum(r[2] for r in reported))


def totals(group) -> tuple[int, int, int, int]:
    return group.calls, group.input_tokens, group.output_tokens, group.cached_input_tokens


async def test_usage_sums_match_the_servers_reports_across_sub_agents_compaction_and_restarts(stack, llm):
    llm.add(*[with_usage(deep_or_summary)] * 40)
    gateway = stack.gateway_stub()
    for i in range(3):  # history enough that the deep turn compacts first
        await chat(gateway, "acct", f"turn {i}: " + "padding " * 150)
    events = await chat(gateway, "acct", "Produce the report, deeply.", mode="deep")
    finished = of_kind(events, "run_finished")[0]
    assert finished.stop_reason == "completed", of_kind(events, "error")
    child = next(r.result for r in of_kind(events, "tool_result") if r.result.name == "delegate_task").data["session_id"]
    # The model server notes a call's usage after its last write, which the turn may outrun.
    await wait_until(lambda: len(llm.reported_usage) >= len(llm.requests))
    reported = llm.reported_usage
    assert any(r.messages[0]["content"] == INSTRUCTION for r in llm.requests)  # a summary call was made
    assert len(reported) == len(llm.requests) >= 9

    report = await usage(gateway, range="all", group_by="session")
    assert totals(report.total) == sums(reported)
    assert report.total.total_tokens == report.total.input_tokens + report.total.output_tokens
    by_session = {g.key: g for g in report.groups}
    assert set(by_session) == {"acct", child}
    # The deep turn's own figure (its sub-agent's included) is what its run_finished said.
    assert by_session["acct"].calls + by_session[child].calls == len(reported)
    assert finished.usage.cached_input_tokens > 0

    by_day = await usage(gateway, range="today")
    assert [g.key for g in by_day.groups] == [time.strftime("%Y-%m-%d", time.gmtime())]
    assert by_day.group_by == "day" and totals(by_day.total) == sums(reported)
    assert not by_day.total.cost_complete and by_day.total.cost == 0  # the default model has no prices

    await stack.restart()
    again = await usage(stack.gateway_stub(), range="7d", group_by="namespace")
    assert [g.key for g in again.groups] == ["default"] and totals(again.total) == sums(reported)


async def test_a_fallback_is_recorded_and_priced_models_get_a_cost(stack, llm, priced, flaky):
    priced.add(reply("the fallback answered", usage=(4000, 1000)), reply("priced again", usage=(2000, 500)))
    gateway = stack.gateway_stub()
    events = await chat(gateway, "fb", "hi", model="flaky")
    assert of_kind(events, "run_finished")[0].final_text == "the fallback answered"
    await chat(gateway, "fb", "again", model="priced")

    report = await usage(gateway, range="all", group_by="model")
    by_model = {g.key: g for g in report.groups}
    assert set(by_model) == {"priced"}  # the failed calls answered nothing and cost nothing
    assert (by_model["priced"].calls, by_model["priced"].fallback_calls) == (2, 1)
    assert by_model["priced"].cost == pytest.approx((6000 * 2.0 + 1500 * 8.0) / 1e6)
    assert by_model["priced"].cost_complete and report.total.cost_complete


@pytest.mark.parametrize(("fields", "says"), [
    ({"range": "week"}, "range must be one of today, 7d, 30d, all (or give start and end), got 'week'"),
    ({"group_by": "user"}, "group_by must be one of day, model, session, namespace, got 'user'"),
    ({"start": 2_000_000_000.0, "end": 1_000_000_000.0},
     "end (2001-09-09 01:46:40 UTC) must be after start (2033-05-18 03:33:20 UTC)"),
    ({"range": "7d", "start": 1_000_000_000.0}, "give either range ('7d') or start/end, not both"),
    ({"start": -5.0}, "start must be a unix time in seconds, from 0 to 253402300799 (9999-12-31), got -5"),
])
async def test_a_range_that_makes_no_sense_is_refused(stack, fields, says):
    err = await rpc_error(usage(stack.gateway_stub(), **fields))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == says


async def test_cli_usage_prints_a_table_and_json(stack, llm, priced):
    from tests.e2e.test_auth_and_cli import run_cli

    llm.add(reply("one", usage=(1200, 300)))
    priced.add(reply("two", usage=(800, 200), cached_tokens=500))
    await chat(stack.gateway_stub(), "cli-u", "hi")
    await chat(stack.gateway_stub(), "cli-u", "hi", model="priced")

    code, out, err = await run_cli(stack, "usage", "--range", "7d", "--by", "model")
    assert code == 0, err
    print(out)
    lines = out.splitlines()
    assert lines[0].startswith("usage from ") and lines[0].endswith("UTC, by model")
    assert lines[1].split() == ["MODEL", "CALLS", "INPUT", "CACHED", "OUTPUT", "TOTAL", "COST"]
    assert lines[2].split() == ["default", "1", "1,200", "0", "300", "1,500", "-"]
    assert lines[3].split() == ["priced", "1", "800", "500", "200", "1,000", "$0.0032"]
    assert lines[5].split() == ["total", "2", "2,000", "500", "500", "2,500", "$0.0032+"]

    code, out, err = await run_cli(stack, "usage", "--json", "--by", "session")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["group_by"] == "session" and answer["total"]["total_tokens"] == 2500
    assert [g["key"] for g in answer["groups"]] == ["cli-u"]

    code, out, err = await run_cli(stack, "usage", "--since", "2030-01-02", "--until", "2030-01-01")
    assert code == 1 and "must be after start" in err
    code, out, err = await run_cli(stack, "usage", "--by", "user")
    assert code == 2


async def test_the_default_models_prices_come_from_the_environment():
    # The core alone (no wire): the catalogue the gateway builds from its settings prices "default".
    from agentmesh.config import Settings
    from agentmesh.gateway.usage import UsageReports
    from agentmesh.internal.v1 import memory_service_pb2
    from agentmesh.models import catalog_of

    class Ledger:
        async def sum_usage(self, start, end, group_by):
            return [memory_service_pb2.UsageSum(key="default", model_name="default", calls=1, input_tokens=2_000_000,
                                        output_tokens=100_000)]

    settings = Settings.from_env({"AGENTMESH_LLM_INPUT_PRICE_PER_MTOK": "0.5", "AGENTMESH_LLM_OUTPUT_PRICE_PER_MTOK": "4"})
    report = await UsageReports(Ledger(), catalog_of(settings.llm), clock=lambda: 2_000_000_000.0).report(
        gateway_pb2.GetUsageRequest(group_by="model"))
    assert report.total.cost == pytest.approx(2 * 0.5 + 0.1 * 4) and report.total.cost_complete
    assert report.start == 2_000_000_000.0 - 3 * 3600 - 33 * 60 - 20 - 6 * 86400  # 00:00 UTC six days before


async def test_a_tenant_sees_only_its_own_usage_activity_and_turns(tenants, llm):  # noqa: F811 - the fixture
    from tests.e2e.test_activity import Watch
    from tests.e2e.test_tenants import auth
    from tests.support.llm_server import tool_call
    from tests.support.turns import LiveTurn

    stack, _ = tenants
    gateway = stack.gateway_stub()
    watch_a = Watch(gateway, metadata=auth("a-viewer"))
    watch_b = Watch(gateway, metadata=auth("b-admin"))
    await watch_a.live()
    await watch_b.live()
    llm.add(reply("", tool_call("memory_search", {"query": "x"})), reply("B's answer", usage=(700, 70)))
    turn = LiveTurn(gateway, "b-work", "hello", metadata=auth("b-member"))
    await turn.finished()
    await wait_until(lambda: ("b-work", "run_finished") in watch_b.kinds())
    watch_a.stop(), watch_b.stop()
    assert ("b-work", "run_started") in watch_b.kinds() and watch_a.kinds() == []

    mine = await gateway.GetUsage(gateway_pb2.GetUsageRequest(range="all"), metadata=auth("a-viewer"), timeout=10)
    theirs = await gateway.GetUsage(gateway_pb2.GetUsageRequest(range="all"), metadata=auth("b-member"), timeout=10)
    assert mine.total.calls == 0 and list(mine.groups) == []
    assert theirs.total.calls == 2 and theirs.total.input_tokens == 10 + 700

    err = await rpc_error(collect(gateway.AttachTurn(gateway_pb2.AttachTurnRequest(session_id="b-work"),
                                                     metadata=auth("a-admin"))))
    assert err.code() == grpc.StatusCode.NOT_FOUND and err.details() == "session 'b-work' does not exist"
