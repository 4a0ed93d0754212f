"""agentmesh: autonomous, tool-using LLM agents as gRPC services."""
