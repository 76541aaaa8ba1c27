"""The rules the client and the server share, and nothing of either.

Canonical form and digests (``canonical``), references (``refs``, ``tag_names``), the registry's
model, its limits and its protobuf mapping (``model``, ``content_limits``, ``registry_map``),
bundle files and publishing checks (``bundle``, ``publishing``), what a step resolves and
when a run is complete (``resolution``, ``completion``), the domain errors and their reasons
(``errors``, ``reasons``), proto<->JSON, enum and time conversions (``proto_json``), page
tokens (``paging``), and how a client reaches a server (``connect``).

``agentrt_sdk`` stands on this package alone; ``agentrt_base`` (the server's base),
``registry`` and ``runtime_service`` build on it. It imports none of them and none of the
server's packages (SQLAlchemy, the gRPC server add-ons, the CLI's rich): tests/unit/
test_import_rules.py. Importing the package imports none of its modules.
"""
