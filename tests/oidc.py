"""An OIDC issuer for tests: keys and a JWKS made in the test, tokens signed with them, and the
JWKS served over HTTP by a local server in a thread (which counts the fetches)."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

ISSUER = "https://issuer.agentrt.test"
AUDIENCE = "agentrt"

#: The claims a GitHub Actions job's token carries (a subset), for a push to main.
GITHUB_CLAIMS = {
    "sub": "repo:acme/agents:ref:refs/heads/main",
    "repository": "acme/agents",
    "repository_owner": "acme",
    "ref": "refs/heads/main",
    "ref_type": "branch",
    "sha": "0123456789abcdef0123456789abcdef01234567",
    "workflow": "publish",
    "job_workflow_ref": "acme/agents/.github/workflows/publish.yml@refs/heads/main",
    "run_id": "4242",
    "event_name": "push",
    "actor": "octocat",
}


class Issuer:
    """Signing keys (RSA, and EC for variety) and their JWKS."""

    def __init__(self, issuer: str = ISSUER) -> None:
        self.issuer = issuer
        self.keys: dict[str, Any] = {}
        self.add_key("k1")

    def add_key(self, kid: str, *, curve: bool = False) -> None:
        self.keys[kid] = (
            ec.generate_private_key(ec.SECP256R1())
            if curve
            else rsa.generate_private_key(public_exponent=65537, key_size=2048)
        )

    def jwks(self, kids: list[str] | None = None) -> dict[str, Any]:
        out = []
        for kid, key in self.keys.items():
            if kids is not None and kid not in kids:
                continue
            algorithm = ECAlgorithm if isinstance(key, ec.EllipticCurvePrivateKey) else RSAAlgorithm
            jwk = algorithm.to_jwk(key.public_key(), as_dict=True)
            jwk.update(kid=kid, use="sig")
            out.append(jwk)
        return {"keys": out}

    def token(
        self,
        *,
        kid: str = "k1",
        key: Any = None,
        algorithm: str = "RS256",
        lifetime: int = 300,
        **claims: Any,
    ) -> str:
        now = int(time.time())
        payload: dict[str, Any] = {
            "iss": self.issuer,
            "aud": AUDIENCE,
            "iat": now,
            "nbf": now,
            "exp": now + lifetime,
            **GITHUB_CLAIMS,
        }
        payload.update(claims)
        signing = key if key is not None else self.keys[kid]
        return jwt.encode(payload, signing, algorithm=algorithm, headers={"kid": kid})


def unsigned(header: dict[str, Any], payload: dict[str, Any]) -> str:
    """A token with ``alg: none`` (or any header) and an empty signature."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part(header)}.{part(payload)}."


class JwksServer:
    """Serves ``document`` (replaceable) at /jwks on 127.0.0.1; ``hits`` counts requests."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits += 1
                body = json.dumps(owner.document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/jwks"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> JwksServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def issuer_config(
    *,
    issuer: str = ISSUER,
    jwks_url: str = "",
    jwks_file: str = "",
    principal: str = "{repository}@{ref}",
    rules: str = "",
    extra: str = "",
) -> str:
    """A ``[[oidc]]`` table (rules default: acme/agents on any ref is an admin publisher)."""
    source = f'jwks_url = "{jwks_url}"' if jwks_url else f'jwks_file = "{jwks_file}"'
    rules = rules or (
        '[[oidc.rules]]\nclaims = { repository = "acme/agents" }\nroles = ["admin"]\n'
        'scopes = ["*"]\n'
    )
    return (
        f'[[oidc]]\nissuer = "{issuer}"\naudiences = ["{AUDIENCE}"]\n{source}\n'
        f'principal = "{principal}"\n{extra}\n{rules}\n'
    )
