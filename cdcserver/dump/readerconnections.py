"""The connections of a chunked dump's readers, opened ahead while the dump gets ready."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cdcserver.core.config import SourceAddress
from cdcserver.dump.snapshot import prepare_session
from cdcserver.replication import source as source_sql


class Connections:
    """The readers' connections, opened ahead in threads while the dump gets ready (connect,
    authenticate, the session set up: round trips that would delay the first chunks); one
    asked for when none is left is opened then."""

    def __init__(self, address: SourceAddress, count: int) -> None:
        self.address = address
        self.lock = threading.Lock()
        self.pending: list[Future[tuple[Any, str]]] = []
        if count > 0:
            pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="dump-connect")
            self.pending = [pool.submit(reader_connection, address) for _ in range(count)]
            pool.shutdown(wait=False)

    def take(self) -> tuple[Any, str]:
        """A connection ready to read, and the server it reached."""
        with self.lock:
            future = self.pending.pop(0) if self.pending else None
        return future.result() if future is not None else reader_connection(self.address)

    def close(self) -> None:
        """The connections not taken closed (after they are open, or failed to)."""
        with self.lock:
            pending, self.pending = self.pending, []
        for future in pending:
            try:
                conn, _ = future.result()
            except Exception:  # noqa: BLE001 - never used: its failure is no one's
                continue
            conn.close()


def reader_connection(address: SourceAddress) -> tuple[Any, str]:
    """A connection with a reader's session set up, and the server it reached."""
    conn = source_sql.connect(address)
    try:
        here = source_sql.server_identity(conn)
        prepare_session(conn, mariadb=True)
    except BaseException:
        conn.close()
        raise
    return conn, here
