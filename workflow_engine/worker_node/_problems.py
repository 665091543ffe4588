"""Error answers as RFC 7807 problem documents (``application/problem+json``), as their node's.

Each carries `type` (``about:blank``: the status says what kind of problem it is), `title`
(the status's phrase), `status`, `detail` (what is wrong, naming
the field when one is at fault, e.g. ``sandbox.command: argv must not be empty``) and
`instance` (the request path); a 400 adds `field`, the field's path alone, for a client that
wants it without parsing `detail`, and a 409 (a job_id of another task) names ``job_id`` there.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus

from starlette.responses import JSONResponse

MEDIA_TYPE = "application/problem+json"
#: RFC 7807's type for a problem that means no more than its HTTP status.
_TYPE = "about:blank"


def problem(
    status: int,
    detail: str,
    *,
    instance: str = "",
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The problem document for `status`, with `detail` saying what is wrong."""
    phrase = HTTPStatus(status).phrase
    body: dict[str, object] = {
        "type": _TYPE,
        "title": phrase,
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers, media_type=MEDIA_TYPE)
