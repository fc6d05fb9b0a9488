"""What HttpStore reads of a server's answer, and no more: a 2xx body
within its bound (the largest answer the client reads, or, for an artifact
verified as it arrives, the size its own envelope declares), an error
answer's first ``ERROR_PREFIX`` bytes, and what the error says (``detail``,
``code``). Past a bound: AnswerTooLarge, saying how much was sent and what
the bound is.

May import: graphcache.envelope_check, graphcache.errors, graphcache.stores.space.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import httpx

from graphcache.envelope_check import EnvelopeCheck
from graphcache.errors import AnswerTooLarge, StoreError
from graphcache.stores.space import human

# Of an error answer only its detail is read: a prefix this long, the rest left unread.
ERROR_PREFIX = 64 * 1024


def read(response: httpx.Response, limit: int, *, shown: str, pause: Callable[[str], None]) -> httpx.Response:
    """``response`` with its body read: a 2xx answer's whole, within
    ``limit`` (AnswerTooLarge past it), any other's prefix. ``shown`` names
    the server in messages; ``pause(because)`` is called where the server
    sent past a bound (``too_large``)."""
    if response.request.method == "HEAD":
        content = b""  # no body: its Content-Length is the artifact's, not this answer's
    elif response.status_code >= 300 or response.status_code < 200:
        body = io.BytesIO()
        for chunk in response.iter_raw():
            body.write(chunk[: ERROR_PREFIX - body.tell()])
            if body.tell() >= ERROR_PREFIX:
                break  # the rest is left unread; the connection is closed
        content = body.getvalue()
    else:
        content = bounded(response, limit, "the largest answer this client reads", shown=shown, pause=pause)
    return httpx.Response(response.status_code, headers=response.headers, content=content, request=response.request)


def bounded(
    response: httpx.Response,
    limit: int,
    bound: str,
    check: EnvelopeCheck | None = None,
    *,
    shown: str,
    pause: Callable[[str], None],
) -> bytes:
    """The body of ``response``, read as it arrives and never past
    ``limit`` bytes (``bound`` says what that is) or, with an envelope
    ``check`` fed as it arrives, past the envelope's own size: then
    AnswerTooLarge, and the server is paused (``pause``: not asked again
    for a while). A declared length past ``limit`` is refused before any
    byte is read. A ``check`` that fails stops the read: the bytes so far
    are returned, for ``check.finish`` to refuse."""
    what = f"{response.request.method} {response.request.url.path}"
    length = declared(response)
    if length is not None and length > limit:
        raise too_large(shown, pause, what, length, limit, bound, declared=True)
    body = io.BytesIO()  # getvalue() hands over its buffer: the body is held once
    for chunk in response.iter_raw():
        size = body.tell() + len(chunk)
        if size > limit:  # refused before the chunk past the limit is kept
            raise too_large(shown, pause, what, size, limit, bound)
        body.write(chunk)
        if check is not None:
            check.feed(chunk)
            if check.failed is not None:
                break
            expected = check.expected
            if expected is not None and expected > limit:
                raise too_large(shown, pause, what, expected, limit, bound, declared=True, envelope=True)
            if expected is not None and size > expected:
                raise too_large(shown, pause, what, size, expected, "the size its own envelope declares")
    return body.getvalue()


def too_large(
    shown: str,
    pause: Callable[[str], None],
    what: str,
    sent: int,
    limit: int,
    bound: str,
    *,
    declared: bool = False,
    envelope: bool = False,
) -> AnswerTooLarge:
    """The error of an answer past its bound. One that was being sent
    (not only declared) counts as a failure of the server and pauses it
    (``pause``), as a server that does not answer does: a proxy sending
    endless bodies is not read again for every key."""
    if declared:
        said = f"its artifact's header declares {sent} bytes" if envelope else f"it declared {sent} bytes"
        hint = (
            "; if the service stores artifacts that large (GRAPHCACHE_MAX_UPLOAD), raise GRAPHCACHE_MAX_ARTIFACT"
            " here to match"
        )
        message = (
            f"{shown} answered {what} with more than this client reads: {said}, over {bound} "
            f"({limit} bytes, {human(limit)})"
        )
        return AnswerTooLarge(message + hint, sent=sent, limit=limit)
    pause(f"it sent more than {human(limit)} for {what}")
    message = (
        f"{shown} sent {sent} bytes or more for {what}, over {bound} ({limit} bytes, {human(limit)}); "
        "the answer was not read further: a proxy or server in between sends endless or oversized bodies "
        "(the service's own answers are at most GRAPHCACHE_MAX_UPLOAD; GRAPHCACHE_MAX_ARTIFACT sets this bound)"
    )
    return AnswerTooLarge(message, sent=sent, limit=limit)


def declared(response: httpx.Response) -> int | None:
    """The Content-Length a response declares, if it declares one."""
    text = response.headers.get("content-length", "").strip()
    return int(text) if text.isdigit() else None


def detail(response: httpx.Response) -> str:
    """What an error answer says: its JSON ``detail``, else its first 200 characters."""
    if not response.content:
        # A HEAD answer (exists) has no body; the service says why in a header.
        return response.headers.get("x-graphcache-error") or f"{response.reason_phrase} (no body)"
    try:
        return str(response.json().get("detail", response.text[:200]))
    except ValueError:
        return response.text[:200]


def code(response: httpx.Response) -> str:
    """An error answer's ``error`` code, ``corrupt`` where it names none."""
    try:
        return str(response.json().get("error", "corrupt"))
    except (ValueError, AttributeError):
        return "corrupt"


def expect(response: httpx.Response, status: int) -> None:
    """Nothing where ``response`` has ``status``, else StoreError naming the request and what it answered."""
    if response.status_code != status:
        raise StoreError(
            f"{response.request.method} {response.request.url.path} answered {response.status_code}: {detail(response)}"
        )
