"""`agentmesh sandbox templates|use`: the deployment's sandbox templates, and the one a
namespace's sessions run their command tools in (docs/tools.md#sandbox-templates)."""

from __future__ import annotations

from agentmesh.cli.common import (
    EXIT_OK,
    gateway_call,
    load_settings,
    print_json,
    service_call,
)

FIELDS = ("isolation", "network", "memory", "disk_quota", "cpu", "image", "runtime_class", "agent_sandbox_pool")


def register(subparsers) -> None:
    sandbox = subparsers.add_parser("sandbox", help="the deployment's sandbox templates; a namespace's choice")
    verbs = sandbox.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("templates", help="list the sandbox templates (image, sizes, network, isolation)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_templates)
    use = verbs.add_parser("use", help="run a namespace's command tools in this template (\"default\" to go back)")
    use.add_argument("template")
    scope = use.add_mutually_exclusive_group()
    scope.add_argument("--namespace", default="", help="whose sessions (default: your own namespace)")
    scope.add_argument("--session", default="", help="this session only (over its namespace's)")
    use.set_defaults(func=use_template)


async def list_templates(args) -> int:
    from agentmesh.v1 import tools_pb2

    reply = await service_call("tools", "ListSandboxTemplates", tools_pb2.ListSandboxTemplatesRequest())
    if args.json:
        print_json([{"name": t.name, "description": t.description, **{f: getattr(t, f) for f in FIELDS}}
                    for t in reply.templates])
        return EXIT_OK
    print(f"{'NAME':<14} {'ISOLATION':<10} {'NETWORK':<8} {'MEMORY':<8} {'DISK':<8} {'CPU':<5} IMAGE")
    for t in reply.templates:
        image = t.image + (f" (runtime {t.runtime_class})" if t.runtime_class else "")
        if t.agent_sandbox_pool:  # the pod is agent-sandbox's SandboxTemplate's, not our image
            image = f"agent-sandbox SandboxWarmPool {t.agent_sandbox_pool}"
        print(f"{t.name:<14} {t.isolation:<10} {t.network:<8} {t.memory:<8} {t.disk_quota:<8} {t.cpu:<5} {image}")
    return EXIT_OK


async def use_template(args) -> int:
    from agentmesh.v1 import sessions_pb2

    settings = load_settings()
    template = "" if args.template == "default" else args.template
    if args.session:
        session = await gateway_call("UpdateSession", sessions_pb2.UpdateSessionRequest(
            session_id=args.session, sandbox_template=template, update_mask=["sandbox_template"]), settings=settings)
        print(f"session {session.session_id}: command tools run in the sandbox template "
              f"{session.sandbox_template or 'its namespace' + chr(39) + 's'}")
        return EXIT_OK
    current = await gateway_call("GetNamespaceSettings", sessions_pb2.GetNamespaceSettingsRequest(namespace=args.namespace),
                                 settings=settings)
    # The request replaces the tool policy as a whole: send the namespace's own back with it.
    updated = await gateway_call("UpdateNamespaceSettings", sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace=current.namespace, tools=current.tools, sandbox_template=template), settings=settings)
    print(f"namespace {updated.namespace}: command tools run in the sandbox template "
          f"{updated.sandbox_template or 'default'}")
    return EXIT_OK
