"""The console's routes: thin Starlette handlers over `pages` (reads) and the Runtime's use
cases (actions), behind the `security.Guard` middleware.

Every action is a POST that passes `checked_form` (read-only refusal, CSRF check) and then
calls the very use case the CLI calls (`rt.cancel`, `rt.retry`, `rt.approve`, `rt.deny`,
`rt.submit_input`) with the operator's name; nothing here writes to the store otherwise.
Approvals and input hand the run back to the queue (`resume="queue"`): the console never
runs an agent itself.
"""

from __future__ import annotations

import re
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote, urlencode
from uuid import UUID

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from steptrail.console import pages
from steptrail.console.forms import fields_for, values_from
from steptrail.console.security import CSRF_COOKIE, CSRF_FIELD, Guard, csrf_ok
from steptrail.domain.actors import check_actor
from steptrail.domain.errors import (
    DigestMismatch,
    DomainError,
    InvalidActor,
    InvalidInput,
    InvalidRunId,
    UnknownRun,
)
from steptrail.domain.ids import short_id
from steptrail.domain.retry_plan import InvalidRetryPosition
from steptrail.runtime import Runtime

OPERATOR_COOKIE = "steptrail_operator"
# A path of this console: one leading slash, then only characters our own URLs use (a
# backslash or a second slash could make a browser leave for another host).
_LOCAL_PATH = re.compile(r"/(?![/\\])[A-Za-z0-9/_.~%?=&-]*")
DONE = {
    "cancel": "Cancelled.",
    "retry": "Put back on the queue.",
    "approve": "Approved; the run is back on the queue for a worker to resume.",
    "deny": "Denied; the run is back on the queue and carries on without those calls.",
    "input": "Input submitted; the run is back on the queue.",
    "operator": "Your actions are now recorded under this name.",
}


@dataclass(frozen=True)
class ConsoleConfig:
    """How the console runs (see `steptrail console --help`)."""

    host: str = "127.0.0.1"
    port: int = 8765
    read_only: bool = False
    token: str | None = None
    operator: str = "operator"
    poll_seconds: float = 5.0
    project: bool = True


class Console:
    """The routes, bound to one runtime and configuration."""

    def __init__(self, rt: Runtime, config: ConsoleConfig) -> None:
        self.rt = rt
        self.config = config
        self.env = Environment(
            loader=PackageLoader("steptrail.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(ago=_ago, ms=_ms, short=_short, when=_when)
        self.env.globals.update(
            read_only=config.read_only,
            poll=config.poll_seconds,
            statuses=pages.STATUSES,
            reasons=pages.REASONS,
            ages=tuple(pages.AGES),
            urlencode=urlencode,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Keep the reporting views caught up while the console runs (when asked to)."""
        stop = threading.Event()
        thread = None
        if self.config.project:
            thread = threading.Thread(
                target=self.rt.projector().run_forever,
                args=(min(self.config.poll_seconds, 1.0), stop),
                name="steptrail-console-views",
                daemon=True,
            )
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join(timeout=10)

    # -- rendering -------------------------------------------------------------------------------

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        template = self.env.get_template(name)
        html = template.render(
            request=request,
            csrf=request.state.csrf,
            operator=self.operator(request),
            done=DONE.get(request.query_params.get("done", "")),
            path=request.url.path,
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def problem(self, request: Request, status: int, message: str) -> Response:
        heading = {400: "Bad request", 404: "Not found"}.get(status, "Refused: nothing was changed")
        return self.render(request, "problem.html", status, message=message, heading=heading)

    def operator(self, request: Request) -> str:
        name = unquote(request.cookies.get(OPERATOR_COOKIE, ""))
        return name if _valid_name(name) else self.config.operator

    # -- pages -----------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        data = await run_in_threadpool(pages.overview, self.rt)
        return self.render(request, "overview.html", o=data)

    async def runs(self, request: Request) -> Response:
        wanted = request.query_params.get("run", "").strip()
        if wanted:
            try:
                found = await run_in_threadpool(self.rt.resolve, wanted)
            except UnknownRun as error:
                return self.problem(request, 404, str(error))
            except InvalidRunId as error:  # not an id, or an ambiguous part of one
                return self.problem(request, 400, str(error))
            return RedirectResponse(f"/runs/{found}", status_code=303)
        try:
            filters = pages.Filters.parse(dict(request.query_params))
        except pages.BadFilter as error:
            return self.problem(request, 400, str(error))
        data = await run_in_threadpool(pages.runs_page, self.rt, filters)
        return self.render(request, "runs.html", p=data)

    async def run(self, request: Request) -> Response:
        given = request.path_params["run_id"]
        try:
            run_id = await run_in_threadpool(self.rt.resolve, given)
        except UnknownRun as error:
            return self.problem(request, 404, str(error))
        except InvalidRunId as error:
            return self.problem(request, 404, str(error))
        if given != str(run_id):  # a part of the id, or another spelling: the page's own URL
            query = f"?{request.url.query}" if request.url.query else ""
            return RedirectResponse(f"/runs/{run_id}{query}", status_code=303)
        raw = request.query_params.get("version")
        version = int(raw) if raw and raw.isdigit() else None
        try:
            data = await run_in_threadpool(pages.run_page, self.rt, run_id, version)
        except UnknownRun as error:
            return self.problem(request, 404, str(error))
        except ValueError as error:
            return self.problem(request, 404, str(error))
        return self.render(request, "run.html", r=data)

    async def inbox(self, request: Request) -> Response:
        items = await run_in_threadpool(pages.inbox, self.rt)
        return self.render(request, "inbox.html", items=items)

    async def dead_letters(self, request: Request) -> Response:
        agent = request.query_params.get("agent") or None
        rows = await run_in_threadpool(pages.dead_letters, self.rt, agent)
        return self.render(request, "dead_letters.html", rows=rows, agent=agent)

    # -- actions ---------------------------------------------------------------------------------

    async def checked_form(self, request: Request) -> FormData:
        """The form of an action, once it passed the read-only and CSRF checks.

        Raises:
            HTTPException: 403 and nothing done.
        """
        if self.config.read_only:
            raise HTTPException(403, "this console is read-only")
        form = await request.form()
        token = form.get(CSRF_FIELD)
        if not csrf_ok(
            request.cookies.get(CSRF_COOKIE),
            token if isinstance(token, str) else None,
            request.headers.get("origin"),
            request.headers.get("host"),
        ):
            raise HTTPException(403, "the form's CSRF token is missing or wrong; reload the page")
        return form

    async def act(self, request: Request) -> Response:
        form = await self.checked_form(request)
        try:
            run_id = await run_in_threadpool(self.rt.resolve, request.path_params["run_id"])
        except UnknownRun as error:
            return self.problem(request, 404, str(error))
        except InvalidRunId as error:
            return self.problem(request, 400, str(error))
        action = request.path_params["action"]
        by = self.operator(request)
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        use_case = self._use_case(action, run_id, by, fields)
        if use_case is None:
            return self.problem(request, 404, f"no action {action!r}")
        try:
            await run_in_threadpool(use_case)
        except UnknownRun as error:
            return self.problem(request, 404, str(error))
        except (InvalidInput, InvalidActor, DigestMismatch, InvalidRetryPosition) as error:
            return self.problem(request, 422, str(error))
        except DomainError as error:
            return self.problem(request, 409, str(error))
        back = fields.get("next", "")
        if not _LOCAL_PATH.fullmatch(back):  # never redirect off the console
            back = f"/runs/{run_id}"
        joiner = "&" if "?" in back else "?"
        return RedirectResponse(f"{back}{joiner}done={action}", status_code=303)

    def _use_case(
        self, action: str, run_id: UUID, by: str, form: dict[str, str]
    ) -> Callable[[], object] | None:
        rt = self.rt
        digest = form.get("digest") or None
        if action == "cancel":
            return lambda: rt.cancel(run_id, by=by)
        if action == "retry":
            text = form.get("from", "").strip()
            if text and not (text.isascii() and text.isdigit()):
                return lambda: _raise(InvalidInput("from step: a whole number, 1 or more"))
            return lambda: rt.retry(
                run_id,
                by=by,
                reset_budget="reset_budget" in form,
                force="force" in form,
                from_position=int(text) if text else None,
            )
        if action in ("approve", "deny"):
            if digest is None:
                return lambda: _raise(InvalidInput("a decision must quote the digest it saw"))
            decide = rt.approve if action == "approve" else rt.deny
            return lambda: decide(run_id, by=by, digest=digest, resume="queue")
        if action == "input":

            def submit() -> object:
                pending = rt.pending(run_id)
                if digest is not None and digest != pending.digest:
                    raise DigestMismatch("the run now asks for other input; reload the page")
                fields = fields_for(pending.input_schema)
                values = values_from(fields, form)
                return rt.submit_input(run_id, values, by=by, resume="queue")

            return submit
        return None

    async def set_operator(self, request: Request) -> Response:
        form = await self.checked_form(request)
        name = str(form.get("name", "")).strip()
        if not _valid_name(name):
            return self.problem(
                request,
                422,
                "a name holds letters, digits, spaces and . _ - @ + : / ' ( ) , # & only",
            )
        response = RedirectResponse("/?done=operator", status_code=303)
        response.set_cookie(
            OPERATOR_COOKIE, quote(name), httponly=True, samesite="strict", max_age=30 * 86400
        )
        return response


def create_app(rt: Runtime, config: ConsoleConfig | None = None) -> Guard:
    """The console as an ASGI app: the routes behind the security middleware."""
    config = config or ConsoleConfig()
    console = Console(rt, config)
    static = StaticFiles(packages=[("steptrail.console", "static")])
    app = Starlette(
        routes=[
            Route("/", console.overview),
            Route("/runs", console.runs),
            Route("/runs/{run_id}", console.run),
            Route("/runs/{run_id}/{action}", console.act, methods=["POST"]),
            Route("/inbox", console.inbox),
            Route("/dead-letters", console.dead_letters),
            Route("/operator", console.set_operator, methods=["POST"]),
            Mount("/static", static, name="static"),
        ],
        lifespan=console.lifespan,
        exception_handlers={HTTPException: _http_problem},
    )
    return Guard(app, token=config.token)


async def _http_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return Response(f"{exc.detail}\n", status_code=exc.status_code, media_type="text/plain")


def _raise(error: Exception) -> object:
    raise error


def _valid_name(name: str) -> bool:
    """An acceptable actor name (the same rule as `--by`, ADR 0021)."""
    try:
        check_actor(name)
    except InvalidActor:
        return False
    return True


def _ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "—"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    if seconds < 0:
        return "in " + _span(-seconds)
    return _span(seconds) + " ago"


def _span(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1000:
        return f"{value:.0f} ms"
    return _span(value / 1000)


def _short(value: object) -> str:
    return short_id(value) if isinstance(value, UUID) else str(value)[-8:]


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
