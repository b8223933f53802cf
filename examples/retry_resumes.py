"""A retry that resumes: an e-mail at step 2, a bug at step 3, a fix, a retry, one e-mail.

    python examples/retry_resumes.py                 # the whole story on a temporary SQLite file

or, step by step, as an operator (the guide, docs/guides/retry.md):

    steptrail --app examples.retry_resumes:buggy_app enqueue mailer \
        -r '{"to": "ada@example.com", "ledger": "/tmp/ledger"}'
    steptrail --app examples.retry_resumes:buggy_app work --burst      # fails at step 3
    steptrail --app examples.retry_resumes:app retry RUN --by you      # the fixed code
    steptrail --app examples.retry_resumes:app work --burst            # completes

`buggy_app` and `app` are two versions of one agent, `mailer`: the same first two steps (a
model call that drafts, a non-idempotent `send_email`), then a third step that has a bug in
the first version. Each real execution of a step's callable appends a line to the request's
`ledger` file: that file, outside the database, is how you see that the retry replayed the
draft and the e-mail instead of running them again.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import steptrail

buggy_app = steptrail.App()
app = steptrail.App()
for _app in (buggy_app, app):
    _app.tool("send_email", effect="non_idempotent_write")


def _note(request: dict[str, Any], what: str) -> None:
    with Path(request["ledger"]).open("a") as ledger:
        ledger.write(f"{what}\n")


def _draft_and_send(ctx: steptrail.RunContext, request: dict[str, Any]) -> dict[str, Any]:
    """Steps 1 and 2, the same in both versions (so the retry's replay matches them)."""

    def draft() -> str:
        _note(request, "draft")  # stands in for a paid model call
        return f"Hello {request['to']}, your order has shipped."

    body = ctx.llm("draft", draft)

    def send() -> dict[str, Any]:
        _note(request, "send_email")  # stands in for the mail server
        return {"message_id": f"<{ctx.run_id}@example.com>"}

    receipt: dict[str, Any] = ctx.tool(
        "send_email", send, arguments={"to": request["to"], "body": body}
    )
    return receipt


@buggy_app.agent("mailer")
def mailer_v1(ctx: steptrail.RunContext, request: dict[str, Any]) -> dict[str, Any]:
    receipt = _draft_and_send(ctx, request)
    # The bug: the receipt has no "id" key (it is "message_id"), so step 3 raises KeyError.
    return {"logged": ctx.step("log", "record_receipt", lambda: receipt["id"])}


@app.agent("mailer")
def mailer_v2(ctx: steptrail.RunContext, request: dict[str, Any]) -> dict[str, Any]:
    receipt = _draft_and_send(ctx, request)
    return {"logged": ctx.step("log", "record_receipt", lambda: receipt["message_id"])}


def main(database_url: str, ledger: Path) -> list[str]:
    """The story, printed; returns the ledger's lines (what really ran)."""
    settings = steptrail.Settings(database_url=database_url, log_level="error")
    request = {"to": "ada@example.com", "ledger": str(ledger)}
    with steptrail.open(buggy_app, settings=settings) as rt:
        run_id = rt.enqueue("mailer", request)
        rt.work(burst=True)
        row = rt.get(run_id)
        print(f"first execution: {row.status.value} ({row.state.reason.value}), ", end="")
        print(f"{row.state.error_type} at step {row.state.steps}")
    with steptrail.open(app, settings=settings) as rt:  # the fixed code is deployed
        try:
            rt.retry(run_id, by="ops", from_position=2)
        except steptrail.PendingWrite as refused:
            print(f"retry --from 2 refused: {refused}")
        plan = rt.retry_plan(run_id)
        print(f"retry: {plan.mode.value}, steps before {plan.position} replay")
        rt.retry(run_id, by="ops")
        rt.work(burst=True)
        print(f"after the retry: {rt.get(run_id).status.value}")
    ran = ledger.read_text().splitlines()
    print(f"really ran: {', '.join(ran)}")
    return ran


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{folder}/example.db"
        main(url, Path(folder) / "ledger")
