"""Async agents on both backends: the same behaviour as sync agents (fencing after a
reclaim, cancel at a boundary, markers, approval suspend/resume, lease renewal), one event
loop per worker, store calls off the loop, and nothing settled without having run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any
from uuid import UUID

import pytest

import steptrail
from steptrail import App, AsyncRunContext, RunContext
from steptrail.domain.enums import FailureClass, Outcome, RunStatus, TerminationReason
from steptrail.domain.errors import DigestMismatch
from steptrail.domain.run import Run
from steptrail.runtime import Runtime
from tests.conftest import FAST, make_runtime


def events_of(rt: Runtime, run_id: UUID) -> list[str]:
    return [type(h.event).__name__ for h in rt.history(run_id)]


def result_of(rt: Runtime, run_id: UUID) -> Any:
    last = rt.history(run_id)[-1].event
    assert isinstance(last, Run.Completed)
    return last.result


def steps_of(rt: Runtime, run_id: UUID) -> list[Run.StepRecorded]:
    return [h.event for h in rt.history(run_id) if isinstance(h.event, Run.StepRecorded)]


def test_async_agent__every_step_runs_before_it_completes(runtime: Runtime) -> None:
    """An `async def` agent is awaited: its steps run and are recorded before `Completed`
    (it used to be settled `completed` without a line of it running)."""
    ran: list[str] = []
    app = App()

    @app.agent("research")
    async def research(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        async def think(k: int) -> str:
            await asyncio.sleep(0.01)
            ran.append(f"think-{k}")
            return f"idea-{k}"

        ideas = [await ctx.llm(f"think-{k}", lambda k=k: think(k)) for k in (1, 2, 3)]
        plain = await ctx.step("compute", "sum", lambda: 42)
        return {"ideas": ideas, "plain": plain}

    runtime.app.include(app)
    run_id = runtime.enqueue("research", {})
    report = runtime.work(burst=True)
    assert report.outcomes == {"completed": 1}
    assert ran == ["think-1", "think-2", "think-3"]
    assert events_of(runtime, run_id) == [
        "Queued",
        "Claimed",
        "StepRecorded",
        "StepRecorded",
        "StepRecorded",
        "StepRecorded",
        "Completed",
    ]
    assert [s.seq for s in steps_of(runtime, run_id)] == [1, 2, 3, 4]
    assert runtime.get(run_id).state.steps == 4


def test_sync_agent_returning_an_awaitable__refused_and_never_settled_completed(
    runtime: Runtime,
) -> None:
    """A plain function that returns a coroutine is not settled as if it had run: the run
    fails not retryable with `AwaitableAgent`, and the coroutine never ran."""
    ran: list[str] = []
    app = App()

    async def body(ctx: Any, request: dict[str, Any]) -> dict[str, Any]:
        ran.append("body")
        return {}

    def wrapped(ctx: Any, request: dict[str, Any]) -> Any:  # a plain def returning a coroutine
        return body(ctx, request)

    app.add_agent("wrapped", wrapped)
    runtime.app.include(app)
    run_id = runtime.enqueue("wrapped", {})
    runtime.work(burst=True)
    row = runtime.get(run_id)
    assert row.status is RunStatus.FAILED
    assert row.state.reason is TerminationReason.NOT_RETRYABLE
    assert ran == []
    last = runtime.history(run_id)[-1].event
    assert getattr(last, "error_type", None) == "AwaitableAgent"


def test_sync_step_returning_an_awaitable__recorded_failed_and_never_run(
    runtime: Runtime,
) -> None:
    """In a sync agent, a step whose callable returns a coroutine fails with
    `AwaitableInSyncStep`; the coroutine never runs and the run does not complete."""
    ran: list[str] = []
    app = App()

    async def fetch() -> str:
        ran.append("fetch")
        return "data"

    @app.agent("mixed_up")
    def mixed_up(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        return {"data": ctx.step("io", "fetch", fetch)}

    runtime.app.include(app)
    run_id = runtime.enqueue("mixed_up", {})
    runtime.work(burst=True)
    assert ran == []
    assert runtime.get(run_id).status is RunStatus.FAILED
    (step,) = steps_of(runtime, run_id)
    assert step.error_type == "AwaitableInSyncStep"


def test_registry__async_callables_recognised() -> None:
    """`async def` functions, partials of them and objects with an async `__call__` are async
    agents; plain functions are not."""
    import functools

    app = App()

    async def coro(ctx: Any, request: dict[str, Any]) -> None: ...

    class Callable_:
        async def __call__(self, ctx: Any, request: dict[str, Any]) -> None: ...

    app.add_agent("a", coro)
    app.add_agent("b", functools.partial(coro))
    app.add_agent("c", Callable_())
    app.add_agent("d", lambda ctx, request: None)
    assert [app.get(n).is_async for n in "abcd"] == [True, True, True, False]


class AsyncGate:
    """Holds an async agent inside a step (without blocking its loop) until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.after: list[str] = []

    async def wait(self) -> str:
        self.entered.set()
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        return "done"


def gated_app(gate: AsyncGate) -> App:
    app = App()
    app.tool("send_email", effect="non_idempotent_write")

    @app.agent("gated_async")
    async def gated(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        await ctx.llm("blocked", gate.wait)
        gate.after.append("step-2")

        async def send() -> str:
            gate.after.append("email-sent")
            return "sent"

        await ctx.tool("send_email", send)
        return {}

    return app


def run_in_thread(rt: Runtime, results: list[Any]) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: rt.worker(concurrency=1, burst=True, on_result=results.append).run()
    )
    thread.start()
    return thread


def test_async_cancel__observed_at_the_next_boundary(db_url: str) -> None:
    """A cancel lands while an async step awaits; the write tool's boundary observes it, so
    the write never runs and the outcome is `cancelled`."""
    gate = AsyncGate()
    rt = make_runtime(db_url, app=gated_app(gate))
    try:
        run_id = rt.enqueue("gated_async", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        assert gate.entered.wait(10)
        assert rt.cancel(run_id, by="op").status is RunStatus.CANCELLED
        gate.release.set()
        thread.join(10)
        assert [r.outcome for r in results] == [Outcome.CANCELLED]
        assert events_of(rt, run_id)[-1] == "Cancelled"
        assert "email-sent" not in gate.after
    finally:
        rt.close()


def test_async_zombie__taken_over_segment_cannot_record_settle_or_write(db_url: str) -> None:
    """An async segment whose run was reclaimed and claimed by another worker records,
    settles and writes nothing more; the new owner's trail is untouched."""
    gate = AsyncGate()
    rt = make_runtime(db_url, app=gated_app(gate))
    try:
        run_id = rt.enqueue("gated_async", {})
        results: list[Any] = []
        thread = run_in_thread(rt, results)
        assert gate.entered.wait(10)
        stale = rt.store.load(run_id)
        assert stale is not None
        stale.reclaim(actor="reaper:test")
        rt.store.append(stale)
        taken = rt.store.claim(holder="worker:other", lease_ms=60_000, agents=["gated_async"])
        assert taken is not None
        gate.release.set()
        thread.join(10)
        assert [r.outcome for r in results] == [Outcome.LEASE_LOST]
        assert "email-sent" not in gate.after
        trail = rt.history(run_id)
        zombie = trail[1].event.actor
        assert all(h.event.actor != zombie for h in trail[2:])
        assert rt.get(run_id).state.holder == "worker:other"
    finally:
        rt.close()


def test_async_tool__marker_durable_before_the_write_runs(db_url: str) -> None:
    """When an async write tool's code runs, its pending-effect marker is in the log, and
    the step that records its result clears it."""
    seen: list[str] = []
    app = App()
    app.tool("send_email", effect="non_idempotent_write")
    rt = make_runtime(db_url, app=app)

    @app.agent("mailer_async")
    async def mailer(ctx: AsyncRunContext, request: dict[str, Any]) -> None:
        async def send() -> None:
            seen.append(events_of(rt, ctx.run_id)[-1])

        await ctx.tool("send_email", send, arguments={"to": "a@example.com"})

    try:
        rt.app.include(app)
        run_id = rt.enqueue("mailer_async", {})
        rt.work(burst=True)
        assert seen == ["EffectPending"]
        row = rt.get(run_id)
        assert row.status is RunStatus.COMPLETED
        assert row.state.pending_effects == ()
    finally:
        rt.close()


def test_async_step_error__recorded_by_class_and_retried(runtime: Runtime) -> None:
    """An async step that raises is recorded with the exception's class only, and the run
    goes through the retry ladder like a sync one."""
    attempts: list[int] = []
    app = App()

    @app.agent("flaky_async")
    async def flaky(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        async def call() -> str:
            attempts.append(ctx.attempt)
            if ctx.attempt == 1:
                raise steptrail.HttpStatusError(503, "secret detail")
            return "ok"

        return {"answer": await ctx.llm("call", call)}

    runtime.app.include(app)
    run_id = runtime.enqueue("flaky_async", {})
    deadline = time.monotonic() + 20
    while not runtime.get(run_id).status.is_terminal and time.monotonic() < deadline:
        runtime.work(burst=True)
        time.sleep(0.05)
    assert runtime.get(run_id).status is RunStatus.COMPLETED
    assert attempts == [1, 2]
    failed = next(h.event for h in runtime.history(run_id) if isinstance(h.event, Run.Requeued))
    assert failed.failure_class is FailureClass.SERVER_ERROR
    first = steps_of(runtime, run_id)[0]
    assert first.error_type == "HttpStatusError"
    assert "secret detail" not in str(first.payload)


def test_async_privacy__records_equal_the_sync_agents(db_url: str) -> None:
    """The same steps recorded by a sync and an async agent carry the same filtered
    payloads, at the default level (metadata) and at `full`."""
    app = App()
    app.tool("lookup", effect="read_only")

    @app.agent("sync_twin")
    def sync_twin(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        text = ctx.llm("draft", lambda: "a reply to jane@example.com", payload={"prompt": "hi"})
        ctx.tool("lookup", lambda: {"rows": 3}, arguments={"q": "x"})
        return {"text": text}

    @app.agent("async_twin")
    async def async_twin(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        async def draft() -> str:
            return "a reply to jane@example.com"

        text = await ctx.llm("draft", draft, payload={"prompt": "hi"})
        await ctx.tool("lookup", lambda: {"rows": 3}, arguments={"q": "x"})
        return {"text": text}

    for level in ("metadata", "full"):
        rt = make_runtime(db_url, app=app, privacy_level=level)
        try:
            a = rt.enqueue("sync_twin", {})
            b = rt.enqueue("async_twin", {})
            rt.work(burst=True)

            def shape(run_id: UUID, rt: Runtime = rt) -> list[tuple[str, str, Any]]:
                return [(s.kind, s.name, s.payload) for s in steps_of(rt, run_id)]

            assert shape(a) == shape(b)
            assert result_of(rt, a) == result_of(rt, b)
        finally:
            rt.close()


def test_async_lease__long_await_renewed_in_background(db_url: str) -> None:
    """An async step awaiting longer than the lease keeps its run: the lease keeper renews
    it while the task awaits, and the reaper skips it."""
    app = App()

    @app.agent("slow_async")
    async def slow(ctx: AsyncRunContext, request: dict[str, Any]) -> None:
        await ctx.llm("long", lambda: asyncio.sleep(1.5, result="ok"))

    rt = make_runtime(db_url, app=app, lease_seconds=0.6)
    try:
        run_id = rt.enqueue("slow_async", {})
        stop = threading.Event()
        reaper = threading.Thread(
            target=rt.reaper().reap_every, args=(0.05,), kwargs={"stop": stop}
        )
        reaper.start()
        report = rt.work(burst=True)
        stop.set()
        reaper.join()
        assert report.outcomes == {"completed": 1}
        names = events_of(rt, run_id)
        assert "LeaseRenewed" in names
        assert "Reclaimed" not in names
    finally:
        rt.close()


def test_worker__sync_and_async_runs_share_one_process_within_concurrency(db_url: str) -> None:
    """One worker runs sync and async agents side by side; async runs share one event loop
    thread, and at most `concurrency` runs are in flight at once."""
    lock = threading.Lock()
    in_flight = [0, 0]  # now, peak
    loop_threads: set[str] = set()
    app = App()

    def enter() -> None:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight[1], in_flight[0])

    def leave() -> None:
        with lock:
            in_flight[0] -= 1

    @app.agent("async_sleeper")
    async def async_sleeper(ctx: AsyncRunContext, request: dict[str, Any]) -> None:
        enter()
        loop_threads.add(threading.current_thread().name)
        await ctx.step("wait", "sleep", lambda: asyncio.sleep(0.2))
        leave()

    @app.agent("sync_sleeper")
    def sync_sleeper(ctx: RunContext, request: dict[str, Any]) -> None:
        enter()
        ctx.step("wait", "sleep", lambda: time.sleep(0.2))
        leave()

    rt = make_runtime(db_url, app=app)
    try:
        ids = [rt.enqueue("async_sleeper", {}) for _ in range(12)]
        ids += [rt.enqueue("sync_sleeper", {}) for _ in range(4)]
        report = rt.work(concurrency=6, burst=True)
        assert report.outcomes == {"completed": 16}
        assert all(rt.get(i).status is RunStatus.COMPLETED for i in ids)
        assert 1 < in_flight[1] <= 6
        assert loop_threads == {"steptrail-async-runs"}
    finally:
        rt.close()


def test_async_worker__store_calls_never_on_the_event_loop(db_url: str) -> None:
    """Every store call an async run makes (load, append, saved) happens on a store thread,
    never on the event loop's thread."""
    app = App()
    app.tool("write", effect="idempotent_write")

    @app.agent("chatty")
    async def chatty(ctx: AsyncRunContext, request: dict[str, Any]) -> None:
        for k in range(3):
            await ctx.llm(f"s{k}", lambda k=k: asyncio.sleep(0.01, result=k))
        await ctx.tool("write", lambda: "w")
        await ctx.heartbeat()

    rt = make_runtime(db_url, app=app)
    calls: list[str] = []
    store = rt.store
    for method in ("append", "load", "saved"):
        original = getattr(store, method)

        def spy(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(threading.current_thread().name)
            return _original(*args, **kwargs)

        setattr(store, method, spy)
    try:
        ids = [rt.enqueue("chatty", {}) for _ in range(5)]
        rt.work(concurrency=5, burst=True)
        assert all(rt.get(i).status is RunStatus.COMPLETED for i in ids)
        assert len(calls) >= 5 * 5
        assert "steptrail-async-runs" not in calls
        assert {name.rsplit("_", 1)[0] for name in calls} <= {
            "steptrail-store",
            "MainThread",  # the dispatcher's burst loop (claims), never a run's step
        }
    finally:
        rt.close()


def test_worker_stop__async_runs_in_flight_finish(db_url: str) -> None:
    """Stopping a worker (as SIGTERM does) lets its async runs in flight finish; it claims
    nothing new."""
    started = threading.Event()
    app = App()

    @app.agent("patient")
    async def patient(ctx: AsyncRunContext, request: dict[str, Any]) -> None:
        started.set()
        for k in range(3):
            await ctx.step("wait", f"w{k}", lambda: asyncio.sleep(0.2))

    rt = make_runtime(db_url, app=app)
    try:
        first = [rt.enqueue("patient", {}) for _ in range(3)]
        worker = rt.worker(concurrency=3)
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert started.wait(10)
        time.sleep(0.1)
        worker.stop()
        later = rt.enqueue("patient", {})
        thread.join(15)
        assert not thread.is_alive()
        assert all(rt.get(i).status is RunStatus.COMPLETED for i in first)
        assert rt.get(later).status is RunStatus.QUEUED
    finally:
        rt.close()


def approval_app() -> App:
    app = App()
    app.tool("send_email", effect="non_idempotent_write")
    sent: list[dict[str, Any]] = []

    @app.agent("approver_async")
    async def approver(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        if ctx.resumed is None:
            await ctx.llm("draft", lambda: asyncio.sleep(0, result="hello"))
            await ctx.request_approval(
                [{"name": "send_email", "arguments": {"to": request["to"]}}],
                conversation={"draft": "hello"},
            )

        async def send(to: str) -> str:
            sent.append({"to": to})
            return "sent"

        results = await ctx.run_pending({"send_email": send})
        return {"results": [r.value or r.error for r in results], "sent": len(sent)}

    return app


def test_async_approval__suspends_then_resumes_through_the_queue(db_url: str) -> None:
    """An async agent suspends for approval (lease released, state saved); a wrong digest is
    refused; approving with the right one queues it and a worker runs the write once."""
    rt = make_runtime(db_url, app=approval_app(), privacy_level="full")
    try:
        run_id = rt.enqueue("approver_async", {"to": "a@example.com"})
        assert rt.work(burst=True).outcomes == {"awaiting_approval": 1}
        row = rt.get(run_id)
        assert row.status is RunStatus.WAITING_FOR_APPROVAL
        assert row.state.holder is None
        with pytest.raises(DigestMismatch):
            rt.approve(run_id, by="alice", digest="0" * 64)
        assert rt.get(run_id).status is RunStatus.WAITING_FOR_APPROVAL
        digest = rt.pending(run_id).digest
        assert rt.approve(run_id, by="alice", digest=digest).outcome is Outcome.REQUEUED
        rt.work(burst=True)
        row = rt.get(run_id)
        assert row.status is RunStatus.COMPLETED
        assert result_of(rt, run_id) == {"result": {"results": ["sent"], "sent": 1}}
        trail = events_of(rt, run_id)
        assert trail.index("EffectPending") > trail.index("Decided")
    finally:
        rt.close()


def test_open_async__facade_enqueue_work_approve_deny_cancel_history(db_url: str) -> None:
    """The async facade drives the whole life of runs from a running loop: enqueue, work
    (async agents on this loop), deny and resume here, cancel, get and history."""

    async def scenario() -> None:
        settings = steptrail.Settings(**{**FAST, "database_url": db_url})
        async with steptrail.open_async(approval_app(), settings=settings) as rt:
            loop_thread = threading.current_thread().name
            started = await rt.start("approver_async", {"to": "b@example.com"})
            assert started.outcome is Outcome.AWAITING_APPROVAL
            denied = await rt.deny(started.run_id, by="bob", resume="here")
            assert denied.outcome is Outcome.COMPLETED
            assert denied.result == {"results": ["denied by the operator"], "sent": 0}
            queued = await rt.enqueue("approver_async", {"to": "c@example.com"})
            report = await rt.work(burst=True, concurrency=4)
            assert report.outcomes == {"awaiting_approval": 1}
            pending = await rt.pending(queued)
            result = await rt.approve(queued, by="alice", digest=pending.digest, resume="here")
            assert result.outcome is Outcome.COMPLETED
            names = [type(h.event).__name__ for h in await rt.history(queued)]
            assert names[-1] == "Completed"
            doomed = await rt.enqueue("approver_async", {"to": "d@example.com"})
            assert (await rt.cancel(doomed, by="op")).status is RunStatus.CANCELLED
            assert threading.current_thread().name == loop_thread

    asyncio.run(scenario())


def test_sync_runtime__async_agent_inside_a_running_loop_is_refused(runtime: Runtime) -> None:
    """`Runtime.start` of an async agent from inside a running loop refuses with a clear
    error before anything runs (await `open_async`'s `start` instead)."""
    app = App()
    ran: list[str] = []

    @app.agent("lonely")
    async def lonely(ctx: AsyncRunContext, request: dict[str, Any]) -> None:
        ran.append("x")

    runtime.app.include(app)

    async def inside() -> None:
        run, body, _ = runtime.begin_interactive("lonely", {})
        with pytest.raises(steptrail.LoopAlreadyRunning):
            runtime.executor().execute(run, body)

    asyncio.run(inside())
    assert ran == []


def test_async_replay__requeued_run_repeats_no_completed_step_or_write(db_url: str) -> None:
    """After a transient failure at step 3, the retry replays the async agent's completed
    model call and write from the journal (each ran once) and runs step 3 again."""
    ran: Counter[str] = Counter()
    app = App()
    app.tool("send_email", effect="non_idempotent_write")

    @app.agent("mailer_replay")
    async def mailer(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        async def draft() -> str:
            ran["draft"] += 1
            return "hello"

        async def send() -> str:
            ran["send"] += 1
            return "sent"

        async def confirm() -> str:
            ran["confirm"] += 1
            if ctx.attempt == 1:
                raise steptrail.HttpStatusError(503)
            return "ok"

        text = await ctx.llm("draft", draft)
        receipt = await ctx.tool("send_email", send, arguments={"body": text})
        return {"receipt": receipt, "confirmed": await ctx.llm("confirm", confirm)}

    rt = make_runtime(db_url, app=app)
    try:
        run_id = rt.enqueue("mailer_replay", {})
        deadline = time.monotonic() + 20
        while not rt.get(run_id).status.is_terminal and time.monotonic() < deadline:
            rt.work(burst=True)
            time.sleep(0.05)
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert ran == Counter({"draft": 1, "send": 1, "confirm": 2})
        replayed = [h.event for h in rt.history(run_id) if isinstance(h.event, Run.Replayed)]
        assert [(e.count, e.last_seq) for e in replayed] == [(2, 2)]
        assert rt.store.journal(run_id) == []  # deleted on settle
    finally:
        rt.close()


def test_async_replay__changed_agent_code_fails_non_deterministic(db_url: str) -> None:
    """An async agent whose steps differ between segments fails not retryable with class
    `non_deterministic`; the mismatching step is never handed the recorded result."""
    app = App()
    handed: list[Any] = []

    @app.agent("shifty")
    async def shifty(ctx: AsyncRunContext, request: dict[str, Any]) -> None:
        name = "first" if ctx.attempt == 1 else "changed"
        handed.append(await ctx.llm(name, lambda: asyncio.sleep(0, result=name)))
        if ctx.attempt == 1:
            raise steptrail.HttpStatusError(503)

    rt = make_runtime(db_url, app=app)
    try:
        run_id = rt.enqueue("shifty", {})
        deadline = time.monotonic() + 20
        while not rt.get(run_id).status.is_terminal and time.monotonic() < deadline:
            rt.work(burst=True)
            time.sleep(0.05)
        row = rt.get(run_id)
        assert row.status is RunStatus.FAILED
        assert row.state.reason is TerminationReason.NOT_RETRYABLE
        assert row.state.failure_class is FailureClass.NON_DETERMINISTIC
        assert handed == ["first"]
    finally:
        rt.close()


def test_async_timeout__step_cancelled_at_its_deadline_and_retried(db_url: str) -> None:
    """An awaiting step past its timeout is cancelled (its task sees CancelledError), fails
    `StepTimedOut` (class timeout), and the run goes down the retry ladder to completion."""
    cancelled: list[int] = []
    app = App()

    @app.agent("hangs_once")
    async def hangs_once(ctx: AsyncRunContext, request: dict[str, Any]) -> str:
        attempt = ctx.attempt

        async def call() -> str:
            try:
                await asyncio.sleep(30 if attempt == 1 else 0)
            except asyncio.CancelledError:
                cancelled.append(attempt)
                raise
            return "answer"

        return await ctx.llm("slow", call, timeout=0.3)

    rt = make_runtime(db_url, app=app)
    try:
        run_id = rt.enqueue("hangs_once", {})
        started = time.monotonic()
        while not rt.get(run_id).status.is_terminal and time.monotonic() - started < 20:
            rt.work(burst=True)
            time.sleep(0.05)
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert time.monotonic() - started < 15
        assert cancelled == [1]
        requeued = next(h.event for h in rt.history(run_id) if isinstance(h.event, Run.Requeued))
        assert requeued.failure_class is FailureClass.TIMEOUT
        assert steps_of(rt, run_id)[0].error_type == "StepTimedOut"
    finally:
        rt.close()


def test_async_approval_in_flow__resume_replays_and_returns_the_decision(db_url: str) -> None:
    """`await ctx.request_approval(...)` suspends; after `approve` the resumed segment replays
    the model call before it (not called again) and gets the decision back."""
    calls: Counter[str] = Counter()
    app = App()
    app.tool("send_email", effect="non_idempotent_write")

    @app.agent("in_flow")
    async def in_flow(ctx: AsyncRunContext, request: dict[str, Any]) -> dict[str, Any]:
        async def draft() -> str:
            calls["draft"] += 1
            return "hi"

        text = await ctx.llm("draft", draft)
        decision = await ctx.request_approval([{"name": "send_email", "arguments": {"body": text}}])

        async def send(body: str) -> str:
            calls["send"] += 1
            return f"sent {body}"

        results = await ctx.run_pending({"send_email": send})
        return {"approved": decision.approved, "by": decision.by, "sent": results[0].value}

    rt = make_runtime(db_url, app=app, privacy_level="full")
    try:
        run_id = rt.enqueue("in_flow", {})
        assert rt.work(burst=True).outcomes == {"awaiting_approval": 1}
        rt.approve(run_id, by="alice", digest=rt.pending(run_id).digest)
        rt.work(burst=True)
        assert rt.get(run_id).status is RunStatus.COMPLETED
        assert calls == Counter({"draft": 1, "send": 1})
        assert result_of(rt, run_id) == {
            "result": {"approved": True, "by": "alice", "sent": "sent hi"}
        }
    finally:
        rt.close()


def test_open_async__sync_agents_run_off_the_loop(db_url: str) -> None:
    """Through the async facade a sync agent (the built-in scripted one) runs on a thread of
    its own, never on the caller's loop, and completes."""
    seen: list[str] = []
    app = App()

    @app.agent("sync_probe")
    def sync_probe(ctx: RunContext, request: dict[str, Any]) -> dict[str, Any]:
        seen.append(threading.current_thread().name)
        ctx.step("probe", "one", lambda: 1)
        return {}

    async def scenario() -> tuple[Outcome, str]:
        settings = steptrail.Settings(**{**FAST, "database_url": db_url})
        async with steptrail.open_async(app, settings=settings) as rt:
            started = await rt.start("sync_probe", {})
            scripted = await rt.start("scripted", {"steps": 2})
            assert scripted.outcome is Outcome.COMPLETED
            return started.outcome, threading.current_thread().name

    outcome, loop_thread = asyncio.run(scenario())
    assert outcome is Outcome.COMPLETED
    assert len(seen) == 1
    assert seen[0] != loop_thread
    assert not seen[0].startswith("steptrail-store")
