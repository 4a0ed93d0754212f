"""`agentmesh models`: the models this deployment offers (AGENTMESH_MODELS and the default), and
with `--namespace` that namespace's own (its ModelConfig resources, docs/agents.md#modelconfig)."""

from __future__ import annotations

from agentmesh.cli.common import EXIT_OK, gateway_call, print_json
from agentmesh.v1 import gateway_pb2


def register(subparsers) -> None:
    models = subparsers.add_parser("models", help="the models a turn may name (chat --model NAME)")
    models.add_argument("--json", action="store_true", help="print one JSON array")
    models.add_argument("--namespace", default="", help="also that namespace's own models (ModelConfig resources)")
    models.set_defaults(func=list_models)


def _price(value: float) -> str:
    return f"{value:g}" if value else "-"


async def list_models(args) -> int:
    reply = await gateway_call("ListModels", gateway_pb2.ListModelsRequest(namespace=args.namespace))
    if args.json:
        print_json([{"name": m.name, "provider": m.provider, "model": m.model, "context_window": m.context_window,
                     "input_price_per_mtok": m.input_price_per_mtok, "output_price_per_mtok": m.output_price_per_mtok,
                     "max_output_tokens": m.max_output_tokens, "fallback": m.fallback, "default": m.is_default,
                     "vision": not m.no_vision, "roles": list(m.roles), "namespace": m.namespace}
                    for m in reply.models])
        return EXIT_OK
    rows = [("NAME", "PROVIDER", "MODEL", "CONTEXT", "VISION", "$/MTOK IN", "$/MTOK OUT", "FALLBACK", "ROLES")]
    for m in reply.models:
        rows.append((m.name + (" *" if m.is_default else "") + (f" ({m.namespace})" if m.namespace else ""), m.provider, m.model,
                     str(m.context_window) if m.context_window else "-", "yes" if not m.no_vision else "-",
                     _price(m.input_price_per_mtok), _price(m.output_price_per_mtok), m.fallback or "-",
                     ", ".join(m.roles) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print("* the default model (AGENTMESH_LLM_*); CONTEXT '-': asked of its server, else AGENTMESH_AGENT_CONTEXT_WINDOW; "
          "(own): each model does it for its own turns")
    return EXIT_OK
