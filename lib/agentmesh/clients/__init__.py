"""One client per service: the single place a service's gRPC stub is built.

A process builds one client for each peer it calls (`agentmesh.clients.memory.MemoryClient`,
`tools.ToolsClient`, `agent.AgentClient`, `gateway.GatewayClient`) from the channel it opened,
and hands it down to the adapters that need it; an adapter (the gateway's `MemorySessions`,
the agent's `GrpcToolRunner`, …) keeps what it does with the peer, the client keeps how the
peer is called: the stub, the peer's name in errors, the default deadline, carried calls.
Living in the shared library, a client is what a service imports to call another — never the
other service's package.
"""
