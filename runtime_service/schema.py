"""Every table of agentrt, gathered on one ``MetaData`` for Alembic.

Importing this module imports each storage module, so ``Base.metadata`` is complete: the
migration environment compares against it and a test checks that migrating an empty database
yields exactly this schema.
"""

from __future__ import annotations

import sqlalchemy as sa

import agentrt_base.installation  # noqa: F401  (registers its table)
import registry.attestation_store
import registry.log_store
import registry.store  # noqa: F401
import runtime_service.store.attestations
import runtime_service.store.ledger
import runtime_service.store.tables  # noqa: F401
from agentrt_base.db import Base

metadata: sa.MetaData = Base.metadata
