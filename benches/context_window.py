"""What the context budget sends: tokens per step on a small and a large window, and how far the
agent's token estimate strays from the server's counts.

    .venv/bin/python -m benches.context_window [--calls 200] [--chars-per-token 3.5]

The agent loop (in process, the OpenAI provider over real HTTP, in-memory transcript) runs
against the scripted model server of tests/agent/test_agent_window.py: the model asks for
`--calls` shell calls of 2 KB output each, one per step, then answers; the server reports each
request's prompt tokens by a fixed rule (`--chars-per-token` characters of the request's JSON
per token), which the agent is not told. Two sessions: one deep turn of all the calls, and ten
turns of a tenth each. For each window (8 192 and 131 072 tokens): steps, summary calls, the
prompt tokens of the turn's steps (mean, largest) as the server counted them, and the estimate
each call carried (`agentmesh.context.estimated_tokens` on its `chat` span) against that count.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import httpx

from agentmesh.agent.providers.base import build_timeout
from tests.agent import test_agent_window as scenario
from tests.agent.agent_fakes import RecordingTelemetry
from tests.support.llm_server import ScriptedLLMServer


async def session(window: int, calls: int, turns: int) -> dict[str, float]:
    telemetry = RecordingTelemetry()
    model = scenario.Model(calls // turns)
    async with httpx.AsyncClient(timeout=build_timeout(30, 5)) as http:
        with ScriptedLLMServer(default=model) as llm:
            agent, _, _ = scenario.make_agent(http, llm, telemetry, window)
            for i in range(turns):
                await scenario.run(agent, f"r{i}", mode="deep" if turns == 1 else "")
            requests = llm.requests
    steps = [scenario.prompt_tokens(r.body) for r in requests if not scenario.is_summary(r)]
    errors, first = [], []
    for span in telemetry.finished_spans():
        attrs = span.attributes or {}
        estimate, counted = attrs.get("agentmesh.context.estimated_tokens"), attrs.get("gen_ai.usage.input_tokens")
        if estimate and counted:
            error = (int(estimate) - int(counted)) / int(counted)  # type: ignore[call-overload]
            (first if not errors and not first else errors).append(error)
    telemetry.shutdown()
    return {"requests": len(requests), "summaries": sum(scenario.is_summary(r) for r in requests),
            "mean": statistics.mean(steps), "max": max(steps),
            "first_error": first[0] if first else 0.0,
            "mean_abs_error": statistics.mean(abs(e) for e in errors) if errors else 0.0,
            "max_abs_error": max((abs(e) for e in errors), default=0.0)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--chars-per-token", type=float, default=3.5)
    args = parser.parse_args()
    scenario.CHARS_PER_TOKEN = args.chars_per_token  # the server's rule, not the agent's
    print(f"{args.calls} shell calls of 2 KB; the server counts {args.chars_per_token} characters of JSON per token")
    print(f"{'session':<22}{'window':>8}{'requests':>10}{'summaries':>10}{'tokens/step':>13}{'largest':>9}"
          f"{'1st est.':>10}{'est. err':>10}{'worst':>8}")
    for turns in (1, 10):
        for window in (8192, 131_072):
            r = await session(window, args.calls, turns)
            label = "one deep turn" if turns == 1 else f"{turns} turns"
            print(f"{label:<22}{window:>8}{r['requests']:>10}{r['summaries']:>10}{r['mean']:>13,.0f}{r['max']:>9,}"
                  f"{r['first_error']:>+10.1%}{r['mean_abs_error']:>10.1%}{r['max_abs_error']:>8.1%}")


if __name__ == "__main__":
    asyncio.run(main())
