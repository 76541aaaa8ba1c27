"""The wire fuzz suite: every RPC, generated and malformed requests, both engines (issue 14)."""
