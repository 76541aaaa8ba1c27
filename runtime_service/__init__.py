"""The agentrt runtime: the run/step ledger, its gRPC services and the server composition."""

__version__ = "0.1.0"
