"""A turn's start in one call to memory (StartTurn), and the background-results check skipped
while nothing can have started a command."""

from __future__ import annotations

from typing import Sequence

from agentmesh.agent.loop.ports import BackgroundCheck, TurnBeginning
from agentmesh.agent.loop.run import TurnRequest
from agentmesh.agent.types import ChatMessage, StatusEvent, ToolCall
from tests.agent.agent_fakes import FakeMemory, FakeTools, FakeTranscripts, ok
from tests.agent.test_agent_loop import collect, make_agent, of
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call


class CountingTranscripts(FakeTranscripts):
    loads = 0

    async def load(self, session_id: str) -> list[ChatMessage]:
        self.loads += 1
        return await super().load(session_id)


class FakeStarter:
    """StartTurn over the fakes: the stored transcript, then the first messages appended."""

    def __init__(self, transcripts: FakeTranscripts, memory: FakeMemory, *, recall_error: str = ""):
        self.transcripts, self.memory = transcripts, memory
        self.recall_error = recall_error
        self.calls: list[tuple[str, str, int]] = []

    async def start(self, session_id: str, first: Sequence[ChatMessage], *, namespace: str, query: str, k: int,
                    recall_timeout_s: float) -> TurnBeginning:
        self.calls.append((session_id, namespace, k))
        stored = list(self.transcripts.history.get(session_id, []))
        await self.transcripts.append(session_id, first)
        hits = [] if self.recall_error else await self.memory.search(namespace, query, k)
        return TurnBeginning(stored, hits, self.recall_error)


async def answer(call: ToolCall):
    return ok(call, "done")


async def test_a_turn_starts_with_one_call_to_memory(http, telemetry):
    earlier = [ChatMessage(role="user", content="earlier question"), ChatMessage(role="assistant", content="earlier answer")]
    transcripts = CountingTranscripts({"s1": earlier})
    memory = FakeMemory(memories=[("team", "the deploy key lives in vault", "fact")])
    starter = FakeStarter(transcripts, memory)
    with ScriptedLLMServer([reply("ok")]) as llm:
        agent = make_agent(http, llm, FakeTools({}), transcripts, telemetry, memory=memory)
        agent.turn_start = starter
        events = await collect(agent.start(TurnRequest(session_id="s1", run_id="r1", message="where is the deploy key",
                                                       namespace="team")))
        sent = llm.requests[0].body["messages"]

    assert starter.calls == [("s1", "team", 3)]
    assert transcripts.loads == 0 and memory.searches == [("team", "where is the deploy key", 3)]
    assert transcripts.batches[0][0].content == "where is the deploy key"  # persisted before the model call
    assert [m["content"] for m in sent[1:3]] == ["earlier question", "earlier answer"]
    assert "the deploy key lives in vault" in sent[0]["content"]
    assert "recalled 1 memory" in [e.message for e in of(events, StatusEvent)]


async def test_a_failed_recall_is_a_status_and_the_turn_goes_on(http, telemetry):
    transcripts = CountingTranscripts()
    memory = FakeMemory(memories=[("default", "tea", "fact")])
    with ScriptedLLMServer([reply("ok")]) as llm:
        agent = make_agent(http, llm, FakeTools({}), transcripts, telemetry, memory=memory)
        agent.turn_start = FakeStarter(transcripts, memory, recall_error="it took longer than 5s")
        failed = await collect(agent.start(TurnRequest(session_id="s1", run_id="r1", message="tea please")))

    assert "could not recall memories (it took longer than 5s); continuing without them" in [
        e.message for e in of(failed, StatusEvent)]
    assert transcripts.loads == 0 and memory.searches == []  # no separate read or search
    assert [m.content for m in transcripts.history["s1"] if m.role == "user"] == ["tea please"]


class CountingBackground:
    def __init__(self):
        self.asked = 0

    def may_have(self, session_id: str) -> bool:
        return True  # not told: ask

    async def take_finished(self, session_id: str) -> BackgroundCheck:
        self.asked += 1
        return BackgroundCheck([], running=0)

    async def stop(self, session_id: str) -> int:
        return 0


async def test_background_results_are_not_asked_for_again_until_something_may_have_started_one(http, telemetry):
    steps = [reply("", tool_call("shell", {"command": "true"}, id="c1")),
             reply("", tool_call("background_run", {"command": "sleep 1"}, id="c2")),
             reply("", tool_call("shell", {"command": "true"}, id="c3")),
             reply("done")]
    background = CountingBackground()
    tools = FakeTools({"shell": answer, "background_run": answer})
    with ScriptedLLMServer(steps) as llm:
        agent = make_agent(http, llm, tools, FakeTranscripts(), telemetry)
        agent.background = background
        await collect(agent.start(TurnRequest(session_id="s1", run_id="r1", message="go")))

    # Asked before step 1; not before step 2 (only `shell` ran); before step 3 (a background_run
    # ran in step 2); not before step 4.
    assert len(llm.requests) == 4 and background.asked == 2


# --- the catalog kept between turns ---------------------------------------------------------


class VersionedTools(FakeTools):
    """FakeTools whose listing carries the catalog's version (as ListTools does)."""

    version = "boot.0"
    listed = 0

    async def listing(self, namespace: str = "", mcp_version: float | None = None):
        from agentmesh.agent.adapters.tool_catalog import Listing

        self.listed += 1
        return Listing(await self.list_tools(namespace, mcp_version=mcp_version), self.version)


async def test_the_catalog_is_listed_once_per_version_and_every_turn_while_no_version_is_known():
    from agentmesh.agent.adapters.tool_catalog import CachedCatalog

    tools = VersionedTools({"shell": answer})
    catalog = CachedCatalog(tools.listing)
    await catalog.tools("team", 0.0)
    await catalog.tools("team", 0.0)
    assert tools.listed == 2  # no version streamed yet: nothing is kept

    catalog.version_now("boot.0")
    assert [s.name for s in await catalog.tools("team", 0.0)] == ["shell"]
    await catalog.tools("team", 0.0)
    await catalog.tools("team", 0.0)
    assert tools.listed == 3  # kept while the version holds
    await catalog.tools("other", 0.0)
    assert tools.listed == 4  # per namespace

    tools.handlers["grep"] = answer
    tools.version = "boot.1"
    catalog.version_now("boot.1")  # a change: the next look lists again and sees it
    assert [s.name for s in await catalog.tools("team", 0.0)] == ["shell", "grep"]
    await catalog.tools("team", 0.0)
    assert tools.listed == 5

    # The namespace's own MCP servers changed (through another tools replica, say): the turn
    # knows a newer mcp_servers_version, so it lists again; a turn that knows none never keeps.
    await catalog.tools("team", 1.0)
    await catalog.tools("team", 1.0)
    assert tools.listed == 6
    await catalog.tools("team")
    await catalog.tools("team")
    assert tools.listed == 8

    catalog.version_now(None)  # the watch broke (the tools service restarts): list every time
    await catalog.tools("team", 1.0)
    await catalog.tools("team", 1.0)
    assert tools.listed == 10


# --- the learning reads, brought by the turn's start -----------------------------------------


class CountingInstructions:
    def __init__(self):
        self.asked = 0

    async def instructions(self, namespace: str):
        from agentmesh.agent.capabilities.instructions import Instructions

        self.asked += 1
        return Instructions(soul="Read from the source.")


class LearningStarter(FakeStarter):
    """A StartTurn that brings the standing instructions (or, `brings=False`, none: an older memory)."""

    def __init__(self, *args, brings: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.brings = brings
        self.asked_learning: list[frozenset[str]] = []

    async def start(self, session_id, first, *, namespace, query, k, recall_timeout_s, learning=frozenset()):
        from agentmesh.agent.capabilities.instructions import Instructions
        from agentmesh.agent.capabilities.learning import Learned

        self.asked_learning.append(learning)
        begun = await super().start(session_id, first, namespace=namespace, query=query, k=k,
                                    recall_timeout_s=recall_timeout_s)
        if not self.brings:
            return begun
        return TurnBeginning(begun.stored, begun.memories, begun.recall_error,
                             Learned(instructions=Instructions(soul="Brought by the turn's start.")))


async def test_standing_instructions_come_with_the_turns_start_and_from_the_source_when_it_brings_none(http, telemetry):
    from agentmesh.agent.capabilities.learning import INSTRUCTIONS, LearningSources

    transcripts, memory = FakeTranscripts(), FakeMemory()
    source = CountingInstructions()
    with ScriptedLLMServer([reply("ok"), reply("ok")]) as llm:
        agent = make_agent(http, llm, FakeTools({}), transcripts, telemetry, memory=memory)
        agent.learning = LearningSources(instructions=source, with_turn_start=True)
        agent.turn_start = starter = LearningStarter(transcripts, memory)
        await collect(agent.start(TurnRequest(session_id="s1", run_id="r1", message="hi")))
        agent.turn_start = LearningStarter(transcripts, memory, brings=False)
        await collect(agent.start(TurnRequest(session_id="s1", run_id="r2", message="hi")))

    assert starter.asked_learning == [frozenset({INSTRUCTIONS})]
    assert "Brought by the turn's start." in llm.requests[0].body["messages"][0]["content"]
    assert "Read from the source." in llm.requests[1].body["messages"][0]["content"]
    assert source.asked == 1  # only for the turn whose start brought nothing


class FinishedBackground(CountingBackground):
    """One background command ended before the turn, handed over on the first ask."""

    async def take_finished(self, session_id: str) -> BackgroundCheck:
        from agentmesh.agent.types import BackgroundDone, ToolOutcome

        self.asked += 1
        if self.asked > 1:
            return BackgroundCheck([], running=0)
        done = BackgroundDone(id="bg1", command="make build", status="finished", seconds=3.0,
                              result=ToolOutcome(call_id="bg1", name="background_run", output="built", exit_code=0))
        return BackgroundCheck([done], running=0)


async def test_background_results_are_collected_beside_the_start_and_kept_when_the_turn_ends_before_a_step(
        http, telemetry):
    from agentmesh.errors import Unavailable

    class FailingStarter(FakeStarter):
        async def start(self, *args, **kwargs):
            raise Unavailable("the memory service at 127.0.0.1:1 is not answering")

    tools = FakeTools({"shell": answer, "background_run": answer})
    transcripts, memory = FakeTranscripts(), FakeMemory()
    with ScriptedLLMServer([reply("seen")]) as llm:
        agent = make_agent(http, llm, tools, transcripts, telemetry, memory=memory)
        agent.background = background = FinishedBackground()
        agent.turn_start = FailingStarter(transcripts, memory)
        await collect(agent.start(TurnRequest(session_id="s1", run_id="r1", message="go")))
        # The turn failed before its first step: what was collected is in the transcript.
        kept = [m.content for m in transcripts.history["s1"] if m.role == "system"]
        assert len(kept) == 1 and "make build" in kept[0] and "built" in kept[0]

        agent.background = background = FinishedBackground()
        agent.turn_start = FakeStarter(transcripts, memory)
        await collect(agent.start(TurnRequest(session_id="s2", run_id="r2", message="go")))
    # Shown to the first step's model call, from the one ask made beside the turn's start.
    assert background.asked == 1
    assert any("make build" in m["content"] for m in llm.requests[0].body["messages"] if m["role"] == "system")
