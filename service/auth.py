"""Bearer tokens for the service: who may read, write and administer."""

from __future__ import annotations

import hmac
import logging

from starlette.requests import Request

from graphcache.settings import Settings
from service.errors import ServiceError

log = logging.getLogger("graphcache.service")


class Auth:
    """Bearer tokens, compared in constant time. Unset read tokens: reads are
    open. Unset write tokens: writes are open (a warning at start). Admin
    actions need an admin token, or a write token when none is set."""

    def __init__(self, settings: Settings) -> None:
        self.admin = tuple(t.encode() for t in settings.admin_tokens)
        self.write = tuple(t.encode() for t in settings.write_tokens) + self.admin
        self.read = tuple(t.encode() for t in settings.read_tokens) + self.write
        self.read_open = not settings.read_tokens
        self.write_open = not settings.write_tokens and not settings.admin_tokens
        if self.write_open:
            log.warning("GRAPHCACHE_WRITE_TOKENS is unset: anyone who reaches this server may upload")

    def check(self, authorization: bytes | None, need: str) -> None:
        if need == "read" and self.read_open:
            return
        if need == "write" and self.write_open:
            return
        if need == "admin" and not self.admin:
            need = "write"
            if self.write_open:
                return
        allowed = {"read": self.read, "write": self.write, "admin": self.admin}[need]
        if not authorization:
            raise ServiceError(
                401,
                "unauthorized",
                f"this route needs {'an' if need == 'admin' else 'a'} {need} token: send 'Authorization: Bearer TOKEN'",
                {"www-authenticate": "Bearer"},
            )
        scheme, _, token = authorization.partition(b" ")
        token = token.strip()
        ok = False
        for candidate in allowed:  # no early exit: constant time in the match position
            ok |= hmac.compare_digest(candidate, token)
        if scheme.lower() != b"bearer" or not ok:
            article = "an" if need == "admin" else "a"
            raise ServiceError(
                403,
                "forbidden",
                f"the token given is not {article} {need} token (one of this server's GRAPHCACHE_{need.upper()}_TOKENS)",
            )

    def allows(self, authorization: bytes | None, need: str) -> bool:
        """Whether ``check`` would pass, without raising."""
        try:
            self.check(authorization, need)
        except ServiceError:
            return False
        return True

    def require(self, request: Request, need: str) -> None:
        """``check`` for a FastAPI route's request."""
        value = request.headers.get("authorization")
        self.check(value.encode() if value is not None else None, need)
