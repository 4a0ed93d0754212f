"""Generated protobuf and gRPC stubs of agentmesh.internal.v1 (made by `make install` from protos/agentmesh/internal/v1/)."""
