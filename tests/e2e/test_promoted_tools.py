"""Self-made tools end to end: the agent promotes a function it wrote in its workspace into a
tool; from the next step the tool is in the catalog, its arguments are checked against the
schema derived from the signature, and its calls run in the session's jail. It survives a
restart of every service, stays in its namespace, has versions and a cap, and a function
without type hints is refused. All five services over real gRPC, a scripted model server."""

from __future__ import annotations

import json

from tests.e2e.conftest import chat, of_kind
from tests.e2e.test_auth_and_cli import run_cli
from tests.e2e.test_standing_instructions import session_in
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack

TOOLS_PY = '''
import os


def word_count(text: str, min_length: int = 1) -> int:
    """Count the words of `text` that have at least `min_length` characters."""
    return len([w for w in text.split() if len(w) >= min_length])


def where_am_i() -> str:
    """Where the tool runs: the working directory and whether it sees a service credential."""
    return os.getcwd() + " key=" + os.environ.get("AGENTMESH_LLM_API_KEY", "none")


def untyped(a, b):
    """No hints."""
    return a + b


def sets(values: set[int]) -> int:
    """A type JSON has no word for."""
    return len(values)
'''


def tool_names(request) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools", [])]


def results(events) -> list:
    """Tool results in the order of their calls (calls of one reply run at the same time)."""
    by_id = {r.result.call_id: r.result for r in of_kind(events, "tool_result")}
    return [by_id[c.call_id] for c in of_kind(events, "tool_call")]


async def test_a_promoted_tool_appears_validates_runs_jailed_and_survives_a_restart(tmp_path, llm):
    stack = Stack(tmp_path / "home", llm_base_url=llm.base_url)
    await stack.start()
    try:
        gateway = stack.gateway_stub()
        await session_in(gateway, "maker", "team-a")
        llm.add(
            reply("", tool_call("write_file", {"path": "mytools.py", "content": TOOLS_PY})),
            reply("", tool_call("promote_skill", {"path": "mytools.py", "function": "word_count", "tool_name": "word_count"}),
                  tool_call("promote_skill", {"path": "mytools.py", "function": "where_am_i", "tool_name": "where_am_i"})),
            reply("", tool_call("word_count", {"text": "a bb ccc dddd", "min_length": 3}),
                  tool_call("word_count", {"text": 5}),
                  tool_call("where_am_i", {})),
            reply("Done."),
        )
        events = await chat(gateway, "maker", "make a word counter")
        assert of_kind(events, "run_finished")[0].final_text == "Done."
        _, promoted, _, counted, refused, where = results(events)
        assert not promoted.is_error and "word_count is now a tool (version 1)" in promoted.output
        # Not offered before it was promoted; offered from the next step on.
        assert "word_count" not in tool_names(llm.requests[1])
        assert {"word_count", "where_am_i"} <= set(tool_names(llm.requests[2]))
        spec = next(t["function"] for t in llm.requests[2].body["tools"] if t["function"]["name"] == "word_count")
        assert spec["description"] == "Count the words of `text` that have at least `min_length` characters."
        assert spec["parameters"] == {"type": "object", "additionalProperties": False, "required": ["text"],
                                      "properties": {"text": {"type": "string"},
                                                     "min_length": {"type": "integer", "default": 1}}}
        assert not counted.is_error and counted.output == "2"
        assert refused.is_error and refused.error_kind == "invalid_arguments"
        assert "invalid arguments for word_count" in refused.output
        # In the jail: the sandbox's working directory, no credential of the services.
        assert not where.is_error and where.output == '"/workspace key=none"', where.output

        await stack.restart()
        gateway = stack.gateway_stub()
        await session_in(gateway, "later", "team-a")
        await session_in(gateway, "other", "team-b")
        llm.add(reply("", tool_call("word_count", {"text": "one two three"})), reply("Three."), reply("Nothing."))
        events = await chat(gateway, "later", "count")
        assert results(events)[0].output == "3"
        assert "word_count" in tool_names(llm.requests[-2])  # before the first model call of a new session
        await chat(gateway, "other", "count")
        assert "word_count" not in tool_names(llm.requests[-1])  # another namespace never sees it

        code, out, err = await run_cli(stack, "skills", "list", "--tools", "--namespace", "team-a", "--json")
        assert code == 0, err
        listed = {t["name"]: t for t in json.loads(out)}
        assert set(listed) == {"word_count", "where_am_i"} and listed["word_count"]["origin"] == "maker:mytools.py"
        code, out, _ = await run_cli(stack, "skills", "remove", "word_count", "--tool", "--namespace", "team-a")
        assert code == 0 and out.strip() == "removed the tool word_count (1 versions)"
        llm.add(reply("Gone."))
        await chat(gateway, "later", "count again")
        assert "word_count" not in tool_names(llm.requests[-1]) and "where_am_i" in tool_names(llm.requests[-1])
    finally:
        await stack.stop()


async def test_what_cannot_be_a_tool_is_refused_and_versions_and_the_cap_hold(tmp_path, llm):
    stack = Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_PROMOTED_TOOLS_MAX": "1"})
    await stack.start()
    try:
        gateway = stack.gateway_stub()
        await session_in(gateway, "s", "team-a")

        def promote(function: str, name: str):
            return tool_call("promote_skill", {"path": "mytools.py", "function": function, "tool_name": name})

        llm.add(
            reply("", tool_call("write_file", {"path": "mytools.py", "content": TOOLS_PY})),
            reply("", promote("untyped", "adder"), promote("sets", "sizer"), promote("nope", "nope"),
                  promote("word_count", "shell")),
            reply("", promote("word_count", "counter")),
            reply("", promote("word_count", "counter")),
            reply("", promote("where_am_i", "where")),
            reply("Done."),
        )
        events = await chat(gateway, "s", "make tools")
        outputs = [r.output for r in results(events)[1:]]
        untyped, sets, missing, clash, first, second, over_cap = outputs
        assert untyped.startswith("error: promote_skill refused: untyped lacks type hints ('a', 'b' and the return value)")
        assert "the type 'set[int]' cannot be described as JSON" in sets
        assert "there is no top-level function 'nope'" in missing and "word_count, where_am_i" in missing
        assert "'shell' is the name of a tool of this deployment; a self-made tool may not take it" in clash
        assert "(version 1)" in first and "(version 2)" in second
        assert "has 1 promoted tools, the most it may have" in over_cap
        assert "adder" not in tool_names(llm.requests[-1]) and "where" not in tool_names(llm.requests[-1])
        assert "counter" in tool_names(llm.requests[-1])
    finally:
        await stack.stop()
