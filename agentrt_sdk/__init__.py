"""agentrt's Python SDK: a client for the registry and the runtime, a worker loop, and model
adapters (``agentrt_sdk.models``)."""
