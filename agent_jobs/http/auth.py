"""Who is asking: a bearer token of `AGENT_JOBS_API_TOKENS`, its actor, the app's roles for it."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from ..errors import ConfigurationError
from ..tools import OPERATOR_ROLE, SERVICE_ROLE
from .errors import AuthenticationError
from .state import server

MAX_TOKEN = 4096
MAX_ACTOR = 200


@dataclass(frozen=True)
class Caller:
    """The actor a request's token names, and the roles the app gives it."""

    actor: str
    roles: frozenset[str]

    @property
    def is_service(self) -> bool:
        """A backend acting for its users (`tools.SERVICE_ROLE`)."""
        return SERVICE_ROLE in self.roles

    @property
    def is_operator(self) -> bool:
        """One who looks after every run (`tools.OPERATOR_ROLE`)."""
        return OPERATOR_ROLE in self.roles

    @property
    def reads_every_run(self) -> bool:
        return self.is_service or self.is_operator


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class TokenTable:
    """The known tokens, kept as SHA-256 digests: compared in constant time, never shown."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._entries = [(_digest(token), actor) for token, actor in tokens.items()]

    @classmethod
    def from_secret(cls, secret: SecretStr | None) -> TokenTable:
        """The table from `AGENT_JOBS_API_TOKENS`; a malformed value is refused without
        repeating any of it (it holds the tokens)."""
        if secret is None or not secret.get_secret_value().strip():
            raise ConfigurationError(
                "the HTTP API needs AGENT_JOBS_API_TOKENS: a JSON object of bearer token to "
                'actor, e.g. {"<long random token>": "alice"}'
            )
        try:
            value = json.loads(secret.get_secret_value())
        except ValueError:
            raise ConfigurationError(
                "AGENT_JOBS_API_TOKENS is not JSON: it must be an object of token to actor"
            ) from None
        if not isinstance(value, dict) or not value:
            raise ConfigurationError(
                "AGENT_JOBS_API_TOKENS must be a non-empty JSON object of token to actor"
            )
        for token, actor in value.items():
            if not token.strip() or len(token) > MAX_TOKEN:
                raise ConfigurationError(
                    f"AGENT_JOBS_API_TOKENS: a token must be 1 to {MAX_TOKEN} characters"
                )
            if not isinstance(actor, str) or not actor.strip() or len(actor) > MAX_ACTOR:
                raise ConfigurationError(
                    f"AGENT_JOBS_API_TOKENS: each token's actor must be a string of 1 to "
                    f"{MAX_ACTOR} characters"
                )
        return cls(value)

    def actor_of(self, token: str) -> str | None:
        """The actor of `token`, or None. Every entry is compared, whatever matches, so the
        time taken says nothing of which tokens exist or how much of one was right."""
        digest = _digest(token)
        found = None
        for known, actor in self._entries:
            if hmac.compare_digest(digest, known):
                found = actor
        return found

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TokenTable({len(self._entries)} tokens)"


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, if there is one."""
    return token_of(request.headers.get("authorization"))


def token_of(header: str | None) -> str | None:
    """The token of an `Authorization` header's value, if it is `Bearer <token>`."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN:
        return None
    return token


def actor_for(tokens: TokenTable, header: str | None) -> str:
    """The actor of an `Authorization` header's token, or `AuthenticationError`."""
    token = token_of(header)
    if token is None:
        raise AuthenticationError(
            "send your API token as the header 'Authorization: Bearer <token>'"
        )
    actor = tokens.actor_of(token)
    if actor is None:
        raise AuthenticationError("unknown API token; ask the operator for one")
    return actor


def authenticate(request: Request) -> Caller:
    """The caller of `request`, or `AuthenticationError`."""
    state = server(request)
    actor = actor_for(state.tokens, request.headers.get("authorization"))
    return Caller(actor=actor, roles=state.door.app.roles.roles_of(actor))


# Declared so the OpenAPI document shows the scheme; the header is read by `authenticate`.
_bearer = HTTPBearer(auto_error=False, description="A token of AGENT_JOBS_API_TOKENS")


def current_caller(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    return authenticate(request)


CallerDep = Annotated[Caller, Depends(current_caller)]
