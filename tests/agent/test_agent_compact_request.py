"""Compaction on request, over real gRPC (agent, memory and tools services; the model a scripted
OpenAI-protocol server): `ChatOptions.compact` (the REPL's `/compact [focus]`) and the `compact`
tool the model may call; and the context-fill figure on the turn's last status event."""

from __future__ import annotations

import json

from agentmesh.agent.capabilities import compaction
from tests.agent.test_agent_finishing import Running, finished, of_kind, run_turn
from tests.support.llm_server import RecordedRequest, reply, tool_call


def is_summary(request: RecordedRequest) -> bool:
    return request.messages[0]["content"] == compaction.INSTRUCTION


def model(request: RecordedRequest):
    if is_summary(request):
        return reply("SUMMARY: the user talked about the parser.")
    last = request.messages[-1]
    if last["role"] == "user" and last["content"].startswith("tidy up"):
        return reply("", tool_call("compact", {"focus": "the parser"}))
    return reply(f"answer {len(request.messages)}")


async def test_a_compact_turn_summarises_with_its_focus_and_stops(tmp_path):
    async with Running(tmp_path, model) as running:
        for i in range(3):
            await run_turn(running.stack, "s1", f"question {i} about the parser")
        events = await run_turn(running.stack, "s1", "/compact", compact=True, compact_focus="the parser")
        after = await run_turn(running.stack, "s1", "and now?")
        requests = running.llm.requests

    done = finished(events)
    assert done.stop_reason == "compacted" and done.final_text.startswith("compacted 6 earlier messages")
    summaries = [r for r in requests if is_summary(r)]
    assert len(summaries) == 1  # the history was far under any threshold: compacted because asked
    assert "Focus: keep in detail what concerns 'the parser'" in summaries[0].messages[1]["content"]
    assert requests.index(summaries[0]) == 3  # no model call for the compact turn itself
    # The next turn starts from the summary.
    sent = requests[-1].messages
    assert sent[1]["content"].endswith("SUMMARY: the user talked about the parser.")
    assert "question 0" not in json.dumps(sent) and finished(after).stop_reason == "completed"
    # The compact turn's message has its answer, so the transcript stays a conversation.
    assert [(m["role"], m["content"][:11]) for m in sent[2:]] == [
        ("user", "/compact"), ("assistant", "(compacted "), ("user", "and now?")]


async def test_the_model_may_compact_mid_turn_and_the_fill_is_reported(tmp_path):
    async with Running(tmp_path, model, env={"AGENTMESH_LLM_CONTEXT_WINDOW": "65536"}) as running:
        for i in range(2):
            await run_turn(running.stack, "s1", f"question {i} about the parser")
        events = await run_turn(running.stack, "s1", "tidy up the context")
        requests = running.llm.requests

    kinds = ["summary" if is_summary(r) else "step" for r in requests]
    assert kinds == ["step", "step", "step", "summary", "step"]  # asked at step 1, compacted before step 2
    assert "Focus: keep in detail what concerns 'the parser'" in requests[3].messages[1]["content"]
    # Step 2 sees the summary in place of the history, then this turn: its message and the compact call.
    step2 = requests[4].messages
    assert [m["role"] for m in step2] == ["system", "system", "user", "assistant", "tool"]
    assert "earlier steps of the current request" in step2[1]["content"]
    assert finished(events).stop_reason == "completed"
    fill = [s for s in of_kind(events, "status") if s.context_window][-1]
    assert fill.context_window == 65536 and fill.context_tokens > 0
    assert fill.message == (f"context: {fill.context_tokens:,} of 65,536 tokens "
                            f"({fill.context_tokens * 100 // 65536}%)")


async def test_a_models_window_is_asked_of_its_server_when_not_configured(tmp_path):
    # vLLM lists the model with max_model_len; llama.cpp with n_ctx; Ollama's /api/show has num_ctx.
    listing = {"object": "list", "data": [{"id": "test-model", "object": "model", "max_model_len": 12_288}]}
    running = Running(tmp_path, model)
    running.llm.listing = listing
    async with running:
        events = await run_turn(running.stack, "s1", "hello")
        probes = running.llm.probes
    fill = [s for s in of_kind(events, "status") if s.context_window][-1]
    assert fill.context_window == 12_288 and ("GET", "/v1/models") in probes


def test_the_window_in_each_servers_answer():
    from agentmesh.agent.providers.window_probe import window_in_listing, window_in_show

    llama_cpp = {"data": [{"id": "m", "meta": {"n_ctx_train": 131072, "n_ctx": 8192}}]}
    assert window_in_listing(llama_cpp, "m") == 8192
    assert window_in_listing({"data": [{"id": "other", "max_model_len": 4096}]}, "m") == 0
    ollama = {"parameters": "stop <|eot|>\nnum_ctx 16384", "model_info": {"llama.context_length": 131072}}
    assert window_in_show(ollama) == 16384
    assert window_in_show({"model_info": {"qwen2.context_length": 32768}}) == 32768
    assert window_in_show({"parameters": 3}) == 0


async def test_a_catalogue_entry_named_default_serves_the_default_turns(tmp_path):
    running = Running(tmp_path, model)
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"[{{name: default, base_url: '{running.llm.base_url}', model: big-model, context_window: 8192,"
                       " temperature: 0.3}]")
    running.env = {**running.env, "AGENTMESH_MODELS": str(catalog)}
    async with running:
        events = await run_turn(running.stack, "s1", "hello")
        body = running.llm.requests[0].body
    assert (body["model"], body["temperature"]) == ("big-model", 0.3)
    fill = [s for s in of_kind(events, "status") if s.context_window][-1]
    assert fill.context_window == 8192
