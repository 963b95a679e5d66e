"""The DBOS tier's child process: one executor of the fleet, killed and restarted by the tests.

Run as ``python -m tests.dbos.worker MODE DATABASE_URL FOLDER [options]`` from the project
root. Every effect is appended, and synced, to ``FOLDER/ledger`` before it returns, so the
test counts executions outside the process that ran them; ``FOLDER/hang`` names a call
(``look`` or ``build``) that, the first time it is entered, writes ``FOLDER/inside`` and
then waits to be killed. The outcome is printed as one JSON line. Modes:

- ``engine``: a plain DBOS workflow whose step appends ``build`` to the ledger (what DBOS
  alone does with a mutating step; ``recover`` runs it again after a kill);
- ``start``: a durable session (a scripted model on a loopback fake endpoint in this
  process: ``look`` (read-only), then ``build`` (mutating), then a final text) started
  through :class:`~metacrate_grid_agent.dbos.DurableSessions` and waited for;
- ``recover``: launch DBOS with the same executor id (DBOS recovers that executor's pending
  workflows) and wait for ``--run``;
- ``approve``: answer the approval of ``build`` in ``--run`` (``--approval``: ``build``
  asks a durable approver first; ``FOLDER/inside`` is written once its question exists);
- ``takeover``: launch as another executor (``--executor``), take over the pending sessions
  of the dead one (``--dead``) and wait for ``--run``;
- ``queue``: the fleet's queue (see :class:`Holding`): sessions ``fleet-a1``, ``fleet-a2``
  (avatar ``a``) and ``fleet-b1`` (avatar ``b``) on the partitioned queue, then ``cap-x`` and
  ``cap-y`` (avatars ``x``, ``y``) on a queue capped at one running session; prints what the
  executors saw (who was inside ``look`` with whom; each session's start and mutating
  call, in order) and each workflow's queue and partition in DBOS's record.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from dbos import DBOS, SetWorkflowID
from metacrate_grid_agent import (
    Effect,
    LLMClient,
    LLMConfig,
    Secret,
    Success,
    Tool,
    ToolLoop,
    ToolLoopConfig,
)
from metacrate_grid_agent.dbos import (
    DBOSApprover,
    DBOSJournal,
    DurableSessions,
    SessionSpec,
    dbos_config,
)
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply

if TYPE_CHECKING:
    from metacrate_grid_agent import (
        ApprovalRequest,
        Approved,
        CancelToken,
        Denied,
        ToolOutcome,
        ValidatedCall,
    )

EXECUTOR_ID: Final = "executor-a"
SESSION_ID: Final = "avatar-7"
GOAL: Final = "look around, then build a wall"
FINAL_TEXT: Final = "I looked around and built the wall."
#: Bound on one worker's whole life: the tests kill it long before.
HANG_S: Final = 600.0
#: Bound on the process itself: SIGALRM (whose default ends it) after this, whatever DBOS's
#: threads are doing; a worker a test lost track of never outlives it.
LIFETIME_S: Final = int(HANG_S) + 60
#: How often a hanging call looks for its release.
RELEASE_POLL_S: Final = 0.02
TOOLS: Final = (
    Tool(
        name="look",
        description="Look around.",
        parameters={"type": "object", "properties": {}},
        effect=Effect.READ_ONLY,
    ),
    Tool(
        name="build",
        description="Build a wall.",
        parameters={"type": "object", "properties": {}},
        effect=Effect.MUTATING,
    ),
)


def respond(request: RecordedRequest) -> Reply:
    """The scripted model: decided from the history alone, so a re-sent request gets the
    same reply in any process."""
    body = json.loads(request.body)
    answered = sum(1 for m in body["messages"] if m.get("role") == "assistant")
    if answered == 0:
        return Reply.completion(None, tool_calls=[("call-look", "look", "{}")])
    if answered == 1:
        return Reply.completion(None, tool_calls=[("call-build", "build", "{}")])
    return Reply.completion(FINAL_TEXT)


class Effects:
    """The executor: every call appended to the ledger (synced) before it returns."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _append(self, line: str) -> None:
        fd = os.open(self.folder / "ledger", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{line}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    async def hang_if_asked(self, name: str) -> None:
        """Inside call ``name``, if told so: say so, then wait to be killed or released."""
        hang = self.folder / "hang"
        if hang.exists() and hang.read_text().strip() == name:
            hang.unlink()
            (self.folder / "inside").write_text(name)
            release = self.folder / "release"
            for _ in range(int(HANG_S / RELEASE_POLL_S)):
                if release.exists():
                    return
                await asyncio.sleep(RELEASE_POLL_S)

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        del cancel
        self._append(call.name)
        await self.hang_if_asked(call.name)
        return Success("a sign to the north" if call.name == "look" else "the wall stands")


class Asking:
    """The durable approver, saying in ``FOLDER/inside`` when it starts to wait."""

    def __init__(self, approver: DBOSApprover, folder: Path) -> None:
        self.approver = approver
        self.folder = folder

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        question = f"{self.approver.run_id}-approval-{request.call.id}"
        answer = asyncio.ensure_future(self.approver.approve(request, cancel))
        # Looked for outside the session's workflow, as the approver itself starts it.
        seen = asyncio.get_running_loop().create_task(
            self._say_when_asked(question), context=contextvars.Context()
        )
        try:
            return await answer
        finally:
            seen.cancel()

    async def _say_when_asked(self, question: str) -> None:
        for _ in range(int(HANG_S / RELEASE_POLL_S)):
            if await DBOS.get_workflow_status_async(question) is not None:
                (self.folder / "inside").write_text("approval")
                return
            await asyncio.sleep(RELEASE_POLL_S)


#: Bound on a ``queue`` session's wait for the session it must overlap with (the test fails
#: if it is reached: the queue held back a session it must run).
OVERLAP_WAIT_S: Final = 30.0
#: How long a ``cap-`` session waits for the other to start (it must not, under the cap): five of
#: the worker's queue polls, so an uncapped queue would have started it.
CAP_WAIT_S: Final = 1.0
#: The ``queue`` mode's sessions: (session id, avatar, capped queue).
FLEET: Final = (
    ("fleet-a1", "a", False),
    ("fleet-a2", "a", False),
    ("fleet-b1", "b", False),
    ("cap-x", "x", True),
    ("cap-y", "y", True),
)


class Fleet:
    """What the ``queue`` mode's executors saw, shared by every session of the process
    (DBOS runs them on its own threads: a lock, and waits that poll)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: set[str] = set()
        self.inside: set[str] = set()
        self.seen_together: list[list[str]] = []
        self.timeouts: list[str] = []
        self.events: list[tuple[str, str]] = []
        """In order: ("start", session) when its workflow builds its loop, ("done",
        session) at its mutating call (only its final request follows)."""


class Holding:
    """A ``queue`` session's executor: inside ``look`` it records who else is inside, and
    waits for the session it must run beside: ``a`` sessions for ``b`` to have entered
    ``look``, ``b`` for an ``a`` one (each bounded by ``OVERLAP_WAIT_S``); a ``cap-``
    session waits up to ``CAP_WAIT_S`` for the other one to start (the first of them waits
    in vain: the queue is capped)."""

    def __init__(self, session_id: str, fleet: Fleet) -> None:
        self.session_id = session_id
        self.fleet = fleet

    def _ready(self, entered: set[str]) -> bool:
        if self.session_id.startswith("fleet-a"):
            return "fleet-b1" in entered
        if self.session_id == "fleet-b1":
            return bool({"fleet-a1", "fleet-a2"} & entered)
        other = "cap-y" if self.session_id == "cap-x" else "cap-x"
        return other in self.fleet.started

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        del cancel
        if call.name != "look":
            with self.fleet.lock:
                self.fleet.events.append(("done", self.session_id))
            return Success("the wall stands")
        fleet = self.fleet
        with fleet.lock:
            fleet.inside.add(self.session_id)
            fleet.seen_together.append(sorted(fleet.inside))
        bound = CAP_WAIT_S if self.session_id.startswith("cap-") else OVERLAP_WAIT_S
        deadline = time.monotonic() + bound
        while True:
            with fleet.lock:
                entered = {s for together in fleet.seen_together for s in together}
                if self._ready(entered):
                    break
            if time.monotonic() > deadline:
                fleet.timeouts.append(self.session_id)
                break
            await asyncio.sleep(RELEASE_POLL_S)
        with fleet.lock:
            fleet.seen_together.append(sorted(fleet.inside))
            fleet.inside.discard(self.session_id)
        return Success("a sign to the north")


async def _queue(
    sessions: DurableSessions, capped: DurableSessions, fleet: Fleet
) -> dict[str, Any]:
    runs = [
        await (capped if on_cap else sessions).start(session, GOAL, generation=1, avatar=avatar)
        for session, avatar, on_cap in FLEET
    ]
    outcomes = {run: (await sessions.outcome(run)).outcome for run in runs}
    found = await DBOS.list_workflows_async(workflow_ids=runs, load_input=False)
    return {
        "outcomes": outcomes,
        "seen_together": fleet.seen_together,
        "timeouts": fleet.timeouts,
        "events": fleet.events,
        "queues": {s.workflow_id: [s.queue_name, s.queue_partition_key] for s in found},
    }


@DBOS.step(name="grid_agent_test.plain_build")
async def _plain_build(folder: str) -> str:
    effects = Effects(Path(folder))
    effects._append("build")
    await effects.hang_if_asked("build")
    return "the wall stands"


@DBOS.workflow(name="grid_agent_test.plain_session")
async def _plain_session(folder: str) -> str:
    return await _plain_build(folder)


async def main(arguments: argparse.Namespace) -> dict[str, Any]:
    mode, database_url, folder = arguments.mode, arguments.database, Path(arguments.folder)
    endpoint = await FakeEndpoint(responder=respond, lifetime_s=HANG_S, strict=False).start()
    key = Secret("sk-test-worker-key-0123456789")
    client = LLMClient(LLMConfig(endpoint_url=endpoint.url, api_key=key))
    effects = Effects(folder)
    fleet = Fleet()

    def build(spec: SessionSpec, approver: DBOSApprover) -> ToolLoop:
        if mode == "queue":
            with fleet.lock:
                fleet.started.add(spec.session_id)
                fleet.events.append(("start", spec.session_id))
            holding = Holding(spec.session_id, fleet)
            return ToolLoop(client, TOOLS, holding, config=ToolLoopConfig())
        asking = Asking(approver, folder) if arguments.approval else None
        return ToolLoop(client, TOOLS, effects, config=ToolLoopConfig(), approver=asking)

    sessions = DurableSessions(
        name="worker",
        journal=DBOSJournal(database_url, secret=key),
        build=build,
        queue_poll_s=0.2,
        supersession_poll_s=0.1,
    )
    capped = DurableSessions(
        name="worker-capped",
        journal=sessions.journal,
        build=build,
        queue="grid_agent_test_capped",
        max_running_sessions=1,
        queue_poll_s=0.2,
        supersession_poll_s=0.1,
    )
    DBOS(
        config=dbos_config(
            name="grid-agent-test", database_url=database_url, executor_id=arguments.executor
        )
    )
    DBOS.launch()
    try:
        await sessions.setup()
        await capped.setup()
        if mode == "queue":
            return await _queue(sessions, capped, fleet)
        if mode == "engine":
            with SetWorkflowID("plain-1"):
                handle = await DBOS.start_workflow_async(_plain_session, str(folder))
            return {"result": await handle.get_result()}
        if mode == "engine-recover":
            handle = await DBOS.retrieve_workflow_async("plain-1")
            return {"result": await handle.get_result()}
        run_id = arguments.run
        if mode == "start":
            run_id = await sessions.start(SESSION_ID, GOAL, generation=arguments.generation)
            if arguments.twice:
                again = await sessions.start(SESSION_ID, GOAL, generation=arguments.generation)
                assert again == run_id, (again, run_id)
        elif mode == "takeover":
            await sessions.take_over(arguments.dead)
        elif mode == "approve":
            waiting = await sessions.pending_approvals(run_id)
            await sessions.approve(run_id, "call-build", approved=True)
            return {"waiting": list(waiting)}
        outcome = await sessions.outcome(run_id)
        return {"outcome": msgspec.to_builtins(outcome)}
    finally:
        # Before DBOS.destroy: DBOS shuts down the loop's default executor, which the
        # journal's worker threads come from.
        await sessions.journal.aclose()
        DBOS.destroy()
        sessions.close()
        capped.close()
        await client.aclose()
        await endpoint.aclose()


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "mode",
        choices=["engine", "engine-recover", "start", "recover", "takeover", "approve", "queue"],
    )
    parser.add_argument("database")
    parser.add_argument("folder")
    parser.add_argument("--run", default=f"{SESSION_ID}-g1-r1")
    parser.add_argument("--executor", default=EXECUTOR_ID)
    parser.add_argument("--generation", type=int, default=1)
    parser.add_argument("--dead", default=EXECUTOR_ID)
    parser.add_argument("--approval", action="store_true", help="build asks an approver")
    parser.add_argument("--twice", action="store_true", help="start the session twice")
    return parser.parse_args()


if __name__ == "__main__":
    signal.alarm(LIFETIME_S)
    print(json.dumps(asyncio.run(main(_arguments()))), flush=True)  # noqa: T201
