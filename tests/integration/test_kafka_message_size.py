"""A databus message holds a whole row event, and a row event the service makes itself (a
resync's rows of a whole table) can be megabytes, which Apache Kafka refuses
(``message.max.bytes``, 1 MiB by default): such an event is sent as several messages, each a
RowsEvent with part of its rows, none larger than ``max_message_bytes`` (unless it holds a
single row). Here the limit is set below the size of MariaDB's own row events (8 KiB), so
that ordinary updates are split."""

from __future__ import annotations

import json

import pytest

from tests.conftest import Source, make_config, start_service
from tests.integration.test_kafka import kafka_caught_up, kafka_section, raw_messages
from tests.integration.test_kafka_delivery import read_changes

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka]


async def test_a_row_event_too_large_for_one_message_is_split_by_rows(
        tmp_path, source: Source, users_file: str, kafka_broker):
    db = f"`{source.database}`"
    limit = 4000
    source.execute(f"CREATE TABLE {db}.wide (id INT PRIMARY KEY, body VARCHAR(400))",
                   f"INSERT INTO {db}.wide SELECT seq, REPEAT('x', 300) FROM "
                   f"{db}.seq_1_to_400")
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         kafka=kafka_section(kafka_broker, source, format="databus",
                                             max_message_bytes=limit))
    running = await start_service(config)
    try:
        source.execute(f"UPDATE {db}.wide SET body = REPEAT('y', 300)")
        await kafka_caught_up(running, source, timeout=120)
    finally:
        await running.stop()
    changes = await read_changes(kafka_broker, source, ("wide",))
    updates = [c for c in changes if c.action == "update"]
    assert sorted(c.after["id"] for c in updates) == list(range(1, 401))
    assert all(c.before["body"] == "x" * 300 and c.after["body"] == "y" * 300
               for c in updates)
    messages = [m for m in await raw_messages(kafka_broker, f"{source.database}.wide")
                if json.loads(m.value).get("Action") == "update"]
    assert all(len(m.value) <= limit or len(json.loads(m.value)["Rows"]) == 2
               for m in messages)
    row_events = [e for e in source.query("SHOW BINLOG EVENTS")
                  if str(e[2]).startswith("Update_rows")]
    assert row_events and len(messages) > len(row_events)  # each was split
