"""Who may call: callers named by a bearer token or a client certificate, each with a role.

The tokens file (`WORKFLOW_ENGINE_TOKENS_FILE`) is JSON::

    {"callers": [
      {"identity": "orchestrator", "role": "orchestrator", "token_sha256": "<64 hex digits>"},
      {"identity": "alice", "role": "operator", "token": "a-long-random-string"},
      {"identity": "dashboard", "role": "reader", "certificate": "dashboard.example"},
      {"identity": "team-a", "role": "operator", "token_sha256": "...", "projects": ["a"]}
    ]}

A caller is named by a token (``token``, or better its SHA-256 as ``token_sha256``: the file
then holds nothing that opens the door) sent as ``authorization: Bearer <token>`` metadata, or
by the common name of a client certificate the server verified against
`WORKFLOW_ENGINE_TLS_CLIENT_CA_FILE` (``certificate``). A token is compared with every entry's
hash in constant time. With a client CA and no tokens file, every verified certificate is an
``orchestrator`` named by its common name.

A file with plaintext tokens is the engine's user's alone (mode 600); one of hashes and
certificate names may be read by others, never written. Running as root, the engine refuses
any other at start-up (`secret_files`).

Roles (`api._roles`, field by field): ``orchestrator`` may call and set everything;
``operator`` may read (get, list, watch), decide approvals (ResumeWorkflow with a decision and
nothing else), override (UpdateWorkflow, but not the plan, budget or limits) and cancel;
``reader`` may only read. Missing or wrong credentials are UNAUTHENTICATED, a role that may not
call a method or set a field PERMISSION_DENIED (naming the field); neither reaches the service,
so nothing changes. Health is always open;
reflection is open while it is enabled (`WORKFLOW_ENGINE_REFLECTION`).

Nor is a refused caller's request decoded: the service's handlers only keep its bytes
(`decoding.deferred`), which `AuthInterceptor` has read (`api._reading`: decoded and counted)
once the caller is known and may call the method.

A caller with ``projects`` and/or ``users`` is scoped to them (a tenant): it sees, lists,
watches and changes only workflows whose task metadata has one of those projects and one of
those users, and starts only such workflows. The service enforces that (`scope()`), answering
another tenant's workflow exactly as one that does not exist.

The caller of the request being served is `caller()`; what a request says about who acts
(``decided_by``, ``operator``) is recorded beside the authenticated name, never instead of it
(`recorded_actor`).
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from workflow_engine import _secret_files as secret_files
from workflow_engine._masking import EngineSecrets
from workflow_engine.api._interceptors import Behavior, MethodInterceptor
from workflow_engine.api._roles import ROLES, refusal
from workflow_engine.domain.records import Scope
from workflow_engine.errors import AuthConfigError, ResourceExhausted, Unauthenticated

_ENTRY_KEYS = {"identity", "role", "token", "token_sha256", "certificate", "projects", "users"}


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller, and the workflows it may see (None: all of them)."""

    name: str
    role: str
    scope: Scope | None = None

    def may_call(self, method: str) -> bool:
        return method in ROLES[self.role]


_CALLER: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("caller", default=None)


def caller() -> Identity | None:
    """The authenticated caller of the request being served; None without authentication."""
    return _CALLER.get()


def scope() -> Scope | None:
    """The workflows the caller of the request being served may see (None: every one)."""
    identity = _CALLER.get()
    return identity.scope if identity is not None else None


def recorded_actor(named: str) -> str:
    """Who a change is recorded as: the authenticated caller, with the name the request gave
    beside it when that differs; without authentication, the name the request gave."""
    identity = caller()
    if identity is None:
        return named
    if named and named != identity.name:
        return f"{identity.name} (request says {named})"
    return identity.name


class Callers:
    """The known callers, by token hash and by certificate name."""

    def __init__(
        self, tokens: Sequence[tuple[bytes, Identity]], certificates: Mapping[str, Identity]
    ) -> None:
        self._tokens = list(tokens)
        self._certificates = dict(certificates)

    @classmethod
    def load(cls, path: str, secrets: EngineSecrets | None = None) -> Callers:
        """Read the tokens file; refuse it, naming the entry and field, when malformed. Its
        plaintext tokens become credentials of `secrets` (the engine's, when it serves)."""
        where = f"WORKFLOW_ENGINE_TOKENS_FILE ({path})"
        try:
            content, mode = secret_files.read(path)
            doc = json.loads(content.decode("utf-8"))
        except (OSError, ValueError) as exc:
            raise AuthConfigError(f"{where}: cannot read it as JSON: {exc}") from None
        entries = doc.get("callers") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries:
            raise AuthConfigError(f'{where}: expected {{"callers": [...]}} with one or more')
        tokens: list[tuple[bytes, Identity]] = []
        certificates: dict[str, Identity] = {}
        for i, entry in enumerate(entries):
            at = f"{where}: callers[{i}]"
            if not isinstance(entry, dict):
                raise AuthConfigError(f"{at}: expected an object")
            unknown = set(entry) - _ENTRY_KEYS
            if unknown:
                raise AuthConfigError(f"{at}: unknown field(s) {sorted(unknown)}")
            name, role = entry.get("identity"), entry.get("role")
            if not isinstance(name, str) or not name.strip():
                raise AuthConfigError(f"{at}.identity: required")
            if role not in ROLES:
                raise AuthConfigError(f"{at}.role: expected one of {', '.join(ROLES)}")
            identity = Identity(name.strip(), str(role), _scope(entry, at))
            given = [k for k in ("token", "token_sha256", "certificate") if k in entry]
            if len(given) != 1:
                raise AuthConfigError(f"{at}: give exactly one of token, token_sha256, certificate")
            value = entry[given[0]]
            if not isinstance(value, str) or not value:
                raise AuthConfigError(f"{at}.{given[0]}: expected a non-empty string")
            if given[0] == "token":
                if len(value) < 16:
                    raise AuthConfigError(f"{at}.token: use at least 16 characters")
                tokens.append((_digest(value), identity))
                if secrets is not None:
                    secrets.add_credentials([value])
            elif given[0] == "token_sha256":
                try:
                    digest = bytes.fromhex(value)
                except ValueError:
                    digest = b""
                if len(digest) != 32:
                    raise AuthConfigError(f"{at}.token_sha256: expected 64 hex digits")
                tokens.append((digest, identity))
            else:
                certificates[value] = identity
        # Plaintext tokens open the door: only the engine's user may read them. Hashes and
        # certificate names may be read, but nobody else may add a caller.
        plaintext = any(isinstance(entry, dict) and "token" in entry for entry in entries)
        problem = secret_files.exposed(
            where, path, mode, holds="plaintext tokens (use token_sha256)" if plaintext else None
        )
        if problem:
            raise AuthConfigError(problem)
        return cls(tokens, certificates)

    def by_token(self, token: str) -> Identity | None:
        """The caller `token` names; every entry is compared, in constant time each."""
        digest = _digest(token)
        found: Identity | None = None
        for expected, identity in self._tokens:
            if hmac.compare_digest(digest, expected) and found is None:
                found = identity
        return found

    def by_certificate(self, name: str) -> Identity | None:
        return self._certificates.get(name)


def _scope(entry: Mapping[str, Any], at: str) -> Scope | None:
    """The entry's `projects` and `users` (lists of names): whose workflows it may see."""
    names: dict[str, frozenset[str]] = {}
    for key in ("projects", "users"):
        value = entry.get(key, [])
        if key in entry and not value:
            raise AuthConfigError(f"{at}.{key}: name one or more, or leave it out")
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise AuthConfigError(f"{at}.{key}: expected a list of non-empty names")
        names[key] = frozenset(value)
    if not names["projects"] and not names["users"]:
        return None
    return Scope(projects=names["projects"], users=names["users"])


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class Authenticator:
    """Names the caller of each request (`identify`) from its metadata and TLS peer."""

    callers: Callers | None  # None: only client certificates (every verified one)
    client_certificates: bool  # the server verifies client certificates

    def identify(self, context: grpc.aio.ServicerContext[Any, Any]) -> Identity:
        header = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        if len(header) > 1:
            raise Unauthenticated("send one authorization header, not several")
        if header:
            value = header[0] if isinstance(header[0], str) else ""
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("the authorization header must be 'Bearer <token>'")
            identity = self.callers.by_token(token.strip()) if self.callers else None
            if identity is None:
                raise Unauthenticated("the bearer token names no caller")
            return identity
        name = self._certificate_name(context)
        if name is not None:
            if self.callers is None:
                return Identity(name, "orchestrator")
            identity = self.callers.by_certificate(name)
            if identity is not None:
                return identity
            raise Unauthenticated(f"the client certificate {name!r} names no caller")
        raise Unauthenticated("credentials required: an 'authorization: Bearer <token>' header")

    def _certificate_name(self, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
        if not self.client_certificates:
            return None
        names = list(context.auth_context().get("x509_common_name") or [])
        return names[0].decode("utf-8", "replace") if names else None


class AuthInterceptor(MethodInterceptor):
    """Runs every call of `service` only for a caller whose role may call its method."""

    def __init__(
        self, authenticator: Authenticator, service: str, read: Callable[[Any], Awaitable[Any]]
    ) -> None:
        """`read` turns a request's kept bytes into a message (`RequestReader.read`)."""
        super().__init__(service)
        self._auth = authenticator
        self._read = read

    async def _admit(self, method: str, request: Any, context: Any) -> Any:
        """The decoded request, once its caller is known and may call `method`."""
        try:
            identity = self._auth.identify(context)
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            raise AssertionError("unreachable: abort raises") from None
        if not identity.may_call(method):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{identity.name} ({identity.role}) may not call {method}",
            )
        _CALLER.set(identity)  # each call runs in its own task: this is the call's caller
        try:
            request = await self._read(request)  # counted against the caller's share
        except ResourceExhausted as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message)
        refused = refusal(identity.role, method, request)
        if refused is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
        return request

    def wrap_unary(self, method: str, inner: Behavior) -> Behavior:
        async def behavior(request: Any, context: Any) -> Any:
            return await inner(await self._admit(method, request, context), context)

        return behavior

    def wrap_stream(self, method: str, inner: Behavior) -> Behavior:
        async def behavior(request: Any, context: Any) -> AsyncIterator[Any]:
            async for item in inner(await self._admit(method, request, context), context):
                yield item

        return behavior
