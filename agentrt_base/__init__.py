"""Pieces both agentrt packages stand on: settings, ids, domain errors and their gRPC mapping,
and the storage base (declarative base, engine factory, session runners).

Import the module you need (``agentrt_core.errors``, ``agentrt_base.db``): this package
imports nothing itself, so a client that needs the errors or the TLS settings does not load
the storage layer (SQLAlchemy) with them.
"""
