"""Each namespace's agent as an A2A agent (the a2a-sdk's server), on the gateway's HTTP address."""
