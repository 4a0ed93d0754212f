"""MCP tool servers as tools: their configuration, one supervised connection per server, and the
provider that puts their tools in the catalog as `<server>__<tool>`."""
