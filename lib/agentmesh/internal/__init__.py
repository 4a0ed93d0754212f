"""Generated stubs of the internal API: what only the services call (Agent, Tools, Memory)."""
