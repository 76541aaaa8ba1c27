"""The console's sign-in sessions: who a browser is, and the token that proves each form.

A session is made when someone signs in with a credential the server's authenticator
accepts (``Authenticator.principal_of``: the same rule the gRPC gate applies). It is kept in
this process's memory only — the credential in it never reaches a page, a log line or the
database — and the browser holds its id in an ``HttpOnly; SameSite=Strict`` cookie. A
restart signs everybody out, which is the safe way for it to fail.

Every state-changing request carries the session's CSRF token (a form field), compared in
constant time. Sign-in itself has no session yet: its form carries a token that must equal
the one in a short-lived cookie set with the form (a double submit), so a page elsewhere
cannot sign a browser in as somebody else.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web
from aiohttp.web_request import FileField
from multidict import MultiDictProxy

from agentrt_base.auth import Principal

#: The cookie holding a session's id, and the one holding a sign-in form's token.
SESSION_COOKIE: Final = "agentrt_console"
SIGN_IN_COOKIE: Final = "agentrt_console_sign_in"
#: How long a session lasts without use, and at most.
IDLE_SECONDS: Final = 3600.0
LIFETIME_SECONDS: Final = 12 * 3600.0
#: Sessions kept at once (the oldest is dropped past it: signing in cannot exhaust memory).
KEPT: Final = 10_000


@dataclass
class Session:
    """One signed-in browser."""

    id: str
    principal: Principal | None  # None: a server without an auth config (loopback only)
    #: What the console sends as ``authorization`` on the principal's behalf ("" when the
    #: server authenticates nobody).
    credential: str = field(repr=False)
    csrf: str = field(repr=False)
    created: float
    used: float

    @property
    def who(self) -> str:
        return self.principal.name if self.principal is not None else "anonymous"


class Sessions:
    """The sessions of one console (this process's memory)."""

    def __init__(self) -> None:
        # Insertion order is age order: the first is the oldest.
        self._sessions: dict[str, Session] = {}
        self._now = time.monotonic

    def open(self, principal: Principal | None, credential: str) -> Session:
        now = self._now()
        self._expire(now)
        while len(self._sessions) >= KEPT:
            self._sessions.pop(next(iter(self._sessions)))
        session = Session(
            id=secrets.token_urlsafe(32),
            principal=principal,
            credential=credential,
            csrf=secrets.token_urlsafe(32),
            created=now,
            used=now,
        )
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with that id (its idle clock restarted), else None."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._now()
        if self._expired(session, now):
            del self._sessions[session_id]
            return None
        session.used = now
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def _expire(self, now: float) -> None:
        for session_id in [s.id for s in self._sessions.values() if self._expired(s, now)]:
            del self._sessions[session_id]

    @staticmethod
    def _expired(session: Session, now: float) -> bool:
        return now - session.used > IDLE_SECONDS or now - session.created > LIFETIME_SECONDS


def same_token(expected: str, given: str | None) -> bool:
    """Whether a form's token is the expected one (constant time; empty never matches)."""
    return bool(expected) and given is not None and hmac.compare_digest(expected, given)


#: Where a request's session is kept (absent: nobody signed in).
SESSION: Final = web.RequestKey("session", Session)

Form = MultiDictProxy[str | bytes | bytearray | FileField]  # what request.post() gives
#: The request's form, once read (a POST's, by the middleware that checks its token).
FORM: Final = web.RequestKey("form", Form)


def cookie_flags(request: web.Request) -> dict[str, Any]:
    return {
        "httponly": True,
        "samesite": "Strict",
        "secure": request.secure,
        "path": "/",
    }


def set_session_cookie(
    request: web.Request, response: web.StreamResponse, session: Session
) -> None:
    response.set_cookie(
        SESSION_COOKIE, session.id, max_age=int(LIFETIME_SECONDS), **cookie_flags(request)
    )


def next_path(value: object) -> str:
    """Where to go after signing in: a path of this console only (never another site)."""
    if (
        isinstance(value, str)
        and value.startswith("/")
        and not value.startswith("//")
        and "\\" not in value
        and all(ord(c) > 0x1F for c in value)
    ):
        return value
    return "/runs"
