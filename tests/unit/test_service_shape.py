"""The service is the list of its components (issue 51): each built complete in its
constructor, none waiting to be filled in while it runs, each with a start and a stop."""

from __future__ import annotations

import asyncio
import inspect

from cdcserver.app.lifecycle import Loops, running
from cdcserver.app.service import Service
from cdcserver.core.names import TableName
from tests.conftest import make_config

MAX_ATTRIBUTES = 10


def _service(tmp_path, **sections) -> Service:
    users = tmp_path / "users"
    users.write_text("")
    return Service(make_config(str(tmp_path / "data"), "mysql://cdc@127.0.0.1:1", str(users),
                               **sections))


def test_the_service_holds_at_most_ten_attributes_none_of_them_empty(tmp_path):
    service = _service(tmp_path, metrics={"listen": "127.0.0.1:0"})
    attributes = vars(service)
    assert len(attributes) <= MAX_ATTRIBUTES, sorted(attributes)
    assert [name for name, value in attributes.items() if value is None] == []


def test_every_component_starts_and_stops(tmp_path):
    service = _service(tmp_path)
    components = service.components()
    assert len({id(c) for c in components}) == len(components)
    for component in components:
        assert inspect.iscoroutinefunction(component.start), component
        assert inspect.iscoroutinefunction(component.stop), component
    # every component the service holds is started (the data, replication, the endpoints..)
    held = [v for v in vars(service).values() if hasattr(v, "start") and hasattr(v, "stop")]
    assert {id(c) for c in held} == {id(c) for c in components}


def test_replication_stops_first_and_the_listener_after_its_final_checkpoint(tmp_path):
    """docs/architecture.md's order: the store opens first and closes last; the listener
    starts before replication (it serves while the source is away), so it stops after
    replication's final checkpoint; housekeeping and the dumps start last, stop first."""
    service = _service(tmp_path)
    assert service.components() == [service.data, service.listener, service.monitoring,
                                     service.admin, service.replication, service.dumps,
                                     service.housekeeping]


class _Part:
    def __init__(self, name: str, log: list[str], fails: bool = False) -> None:
        self.name, self.log, self.fails = name, log, fails

    async def start(self) -> None:
        if self.fails:
            raise RuntimeError(f"{self.name} cannot start")
        self.log.append(f"start {self.name}")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")


def test_components_start_in_order_and_stop_in_reverse():
    log: list[str] = []

    async def serve() -> None:
        async with running([_Part("a", log), _Part("b", log), _Part("c", log)]):
            log.append("serving")

    asyncio.run(serve())
    assert log == ["start a", "start b", "start c", "serving", "stop c", "stop b", "stop a"]


def test_a_component_that_cannot_start_stops_those_started_before_with_its_error():
    log: list[str] = []

    async def serve() -> None:
        async with running([_Part("a", log), _Part("b", log, fails=True), _Part("c", log)]):
            log.append("serving")

    try:
        asyncio.run(serve())
    except RuntimeError as exc:
        assert str(exc) == "b cannot start"
    else:
        raise AssertionError("the failure to start was lost")
    assert log == ["start a", "stop a"]


def test_a_failure_while_serving_stops_every_component_in_reverse():
    log: list[str] = []

    async def serve() -> None:
        async with running([_Part("a", log), _Part("b", log)]):
            raise ValueError("replication failed")

    try:
        asyncio.run(serve())
    except ValueError:
        pass
    assert log == ["start a", "start b", "stop b", "stop a"]


def test_loops_are_cancelled_at_stop_and_one_loops_failure_leaves_the_others():
    async def scenario() -> tuple[bool, bool]:
        loops = Loops()
        ticks: list[int] = []

        async def fails() -> None:
            raise RuntimeError("one loop's own problem")

        async def ticking() -> None:
            while True:
                ticks.append(1)
                await asyncio.sleep(0.001)

        loops.spawn(fails(), "fails")
        loops.spawn(ticking(), "ticks")
        await asyncio.sleep(0.05)
        alive = bool(ticks)
        await loops.cancel()
        before = len(ticks)
        await asyncio.sleep(0.02)
        return alive, len(ticks) == before

    alive, stopped = asyncio.run(scenario())
    assert alive and stopped


def test_a_dump_asked_for_before_the_dumps_start_waits_for_them(tmp_path):
    """The service is built outside its event loop (``cdcserver run``), and the listener
    starts before the dumps: a client's REQUEST-DUMP in between is queued, not refused."""
    service = _service(tmp_path)
    scheduler = service.dumps.scheduler
    table = TableName("shop", "orders")

    async def ask() -> list[TableName]:
        return scheduler.request([table])

    assert asyncio.run(ask()) == [table]
    assert [entry["state"] for entry in scheduler.listed()] == ["queued"]
