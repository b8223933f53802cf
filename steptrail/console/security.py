"""What keeps the console safe by default, as one ASGI middleware and a few pure checks.

* **Bind.** Loopback only, unless a token is configured: `check_bind` refuses any other
  address without `STEPTRAIL_CONSOLE_TOKEN`, before a socket is opened.
* **Token.** When a token is configured, every request (pages, assets, actions) must carry
  it: `Authorization: Bearer …`, or the `steptrail_token` cookie that a first visit with
  `?token=…` sets (HttpOnly, SameSite=Strict; the token is then dropped from the URL by a
  redirect). Compared in constant time.
* **Host.** Without a token (loopback), only a loopback `Host` header is served, so a page
  elsewhere cannot reach the console by rebinding its DNS name to 127.0.0.1.
* **CSRF.** Every state change is a POST whose form carries the value of the
  `steptrail_csrf` cookie (double submit; the cookie is SameSite=Strict and unreadable by
  script), and whose `Origin`, when the browser sends one, is the console's own.
* **Headers.** A strict Content-Security-Policy (scripts and styles only from the console
  itself, no inline script), no framing, no referrer, no caching of pages.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.requests import cookie_parser

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_ENV = "STEPTRAIL_CONSOLE_TOKEN"  # noqa: S105 -- the variable's name, not a secret
TOKEN_COOKIE = "steptrail_token"  # noqa: S105 -- the cookie's name, not a secret
CSRF_COOKIE = "steptrail_csrf"
CSRF_FIELD = "csrf"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class ConsoleRefused(RuntimeError):
    """The console will not start as configured (e.g. a public bind without a token)."""


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or name to bind or to serve) is this machine only."""
    name = host.strip().lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a token (and a token too short to be one).

    Raises:
        ConsoleRefused.
    """
    if token is not None and len(token) < 16:
        raise ConsoleRefused(f"{TOKEN_ENV} must be at least 16 characters")
    if not is_loopback(host) and not token:
        raise ConsoleRefused(
            f"refusing to listen on {host}: any address but loopback needs {TOKEN_ENV} "
            "(every request must then carry it)"
        )


def same(a: str | None, b: str | None) -> bool:
    """Constant-time equality of two secrets; None never matches."""
    if not a or not b:
        return False
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def csrf_ok(cookie: str | None, field: str | None, origin: str | None, host: str | None) -> bool:
    """The double-submit check of a POST: the form echoes the cookie, and the Origin (if the
    browser sent one) is this console."""
    if not same(cookie, field):
        return False
    if origin is None:
        return True
    return origin.split("://", 1)[-1].lower() == (host or "").lower()


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    # Starlette's lenient parser: another local app's odd cookie must not hide ours (the
    # standard library's SimpleCookie stops at the first cookie it cannot parse).
    return cookie_parser(headers.get("cookie", ""))


def _cookie(name: str, value: str, *, max_age: int | None = None) -> str:
    parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    return "; ".join(parts)


class Guard:
    """The console's one middleware: token, host, CSRF cookie, security headers."""

    def __init__(self, app: ASGIApp, *, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        cookies = _cookies(headers)
        host = headers.get("host", "")
        if self.token is None and not is_loopback(host.rsplit(":", 1)[0]):
            await _plain(send, 421, "this console answers to its loopback address only")
            return
        if self.token is not None:
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            if scope["method"] == "GET" and same(query.get("token"), self.token):
                rest = urlencode({k: v for k, v in query.items() if k != "token"})
                location = scope["path"] + (f"?{rest}" if rest else "")
                await _redirect(send, location, [_cookie(TOKEN_COOKIE, self.token)])
                return
            bearer = headers.get("authorization", "")
            offered = bearer[7:] if bearer.lower().startswith("bearer ") else None
            if not (same(offered, self.token) or same(cookies.get(TOKEN_COOKIE), self.token)):
                await _plain(send, 401, f"this console needs its token ({TOKEN_ENV})")
                return
        csrf = cookies.get(CSRF_COOKIE)
        fresh = csrf is None or len(csrf) < 32
        if fresh:
            csrf = secrets.token_urlsafe(32)
        scope.setdefault("state", {})["csrf"] = csrf
        scope["state"]["csrf_cookie"] = None if fresh else csrf

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"same-origin"),
                ]
                if not scope["path"].startswith("/static/"):
                    extra.append((b"cache-control", b"no-store"))
                if fresh:
                    extra.append((b"set-cookie", _cookie(CSRF_COOKIE, str(csrf)).encode()))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _plain(send: Send, status: int, text: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-security-policy", CSP.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": text.encode("utf-8") + b"\n"})


async def _redirect(send: Send, location: str, cookies: list[str]) -> None:
    headers = [(b"location", location.encode("latin-1")), (b"referrer-policy", b"same-origin")]
    headers += [(b"set-cookie", c.encode("latin-1")) for c in cookies]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
