"""The roles a principal may hold. What each one may do is ``agentrt_base.access``'s table;
this module is only their names, so that a command line offering them as choices (``agentrt
token create --role``) need not load authentication (JWT, OIDC)."""

from __future__ import annotations

from typing import Final

ROLES: Final = ("publisher", "tag-admin", "client", "approver", "worker", "auditor", "admin")
