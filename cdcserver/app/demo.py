"""``cdcserver demo``: the service on a private MariaDB with a sample schema.

Starts an embedded MariaDB (installing Debian's mariadb-server if needed), creates the ``shop``
database with some history (inserts, updates, a delete, an ALTER that makes version 2 of
``shop.orders``), writes a users file with ``cdcuser``/``cdcpass``, runs the service and prints
how to connect. While it runs, a new order arrives every few seconds so the live tail shows
something. Ctrl-C stops the service and the database; the state stays in ``--dir``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import socket

from cdcserver.app import recovering
from cdcserver.app.embedded import EmbeddedMariaDB, ensure_mariadb_installed
from cdcserver.app.process import run_until_signalled
from cdcserver.app.service import Service
from cdcserver.core.config import (
    AdminConfig,
    Config,
    DumpConfig,
    ListenerConfig,
    MetricsConfig,
    SourceConfig,
    StoreConfig,
)
from cdcserver.core.gtid import GtidState
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client.format.wire import auth_message

DEMO_USER, DEMO_PASSWORD = "cdcuser", "cdcpass"

SCHEMA = (
    "CREATE DATABASE shop",
    "CREATE TABLE shop.customers (id INT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(100) NOT NULL,"
    " email VARCHAR(200), country CHAR(2), created TIMESTAMP(3) DEFAULT CURRENT_TIMESTAMP(3))",
    "CREATE TABLE shop.orders (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,"
    " customer_id INT NOT NULL, amount DECIMAL(10,2) NOT NULL,"
    " status ENUM('new','paid','shipped','cancelled') NOT NULL DEFAULT 'new', note TEXT,"
    " placed DATETIME(6) NOT NULL)",
)
HISTORY = (
    "INSERT INTO shop.customers (name, email, country) VALUES ('Ada Lovelace', 'ada@example.com',"
    " 'GB'), ('Grace Hopper', 'grace@example.com', 'US'), ('Émilie du Châtelet', NULL, 'FR')",
    "INSERT INTO shop.orders (customer_id, amount, note, placed) VALUES"
    " (1, 19.99, 'first order', '2024-05-01 10:00:00.123456'),"
    " (2, 1250.00, NULL, '2024-05-01 11:30:00'), (3, 7.50, 'gift 🎁', '2024-05-02 09:15:00')",
    "UPDATE shop.orders SET status = 'paid' WHERE id IN (1, 2)",
    "UPDATE shop.orders SET status = 'shipped' WHERE id = 1",
    "DELETE FROM shop.orders WHERE id = 3",
    "ALTER TABLE shop.orders ADD COLUMN coupon VARCHAR(16) NULL AFTER amount",
    "INSERT INTO shop.orders (customer_id, amount, coupon, placed) VALUES"
    " (1, 42.00, 'SPRING24', NOW(6))",
)


def run_demo(directory: str, listen: str, mariadb_port: int, trickle: float) -> int:
    # the server, and netcat for the example it prints (openbsd's: the docs use its -N)
    ensure_mariadb_installed("nc=netcat-openbsd")
    os.makedirs(directory, exist_ok=True)
    db = EmbeddedMariaDB(os.path.join(directory, "mariadb"),
                         port=mariadb_port if _port_free(mariadb_port) else 0)
    db.start()
    try:
        if not db.query("SHOW DATABASES LIKE 'shop'"):
            db.execute(*SCHEMA, *HISTORY)
        users_file = os.path.join(directory, "cdcusers")
        UsersFile(users_file).add(DEMO_USER, DEMO_PASSWORD)
        host, port = listen.rsplit(":", 1)
        if not _port_free(int(port), host):
            listen = f"{host}:0"
        config = Config(
            source=SourceConfig(url=db.url(), server_id=4001, start_gtid="oldest"),
            store=StoreConfig(data_dir=os.path.join(directory, "data")),
            listener=ListenerConfig(listen=listen, users_file=users_file),
            dump=DumpConfig(tables="shop.*", interval=86400.0),  # a dump of each table daily
            metrics=MetricsConfig(listen="127.0.0.1:4002" if _port_free(4002) else
                                  "127.0.0.1:0"),
            admin=AdminConfig(listen="127.0.0.1:8989" if _port_free(8989) else "127.0.0.1:0",
                              token_file=_admin_token(directory)))
        return run_until_signalled(lambda stop: _serve(config, db, trickle, stop))
    finally:
        db.stop()


async def _serve(config: Config, db: EmbeddedMariaDB, trickle: float,
                 stop: asyncio.Event) -> None:
    helpers: list[asyncio.Task[None]] = []

    def started(running: Service) -> None:  # again after a start over (a failed disk)
        for task in helpers:
            task.cancel()
        helpers.append(asyncio.create_task(_announce(running, db, trickle)))

    try:
        await recovering.serve(config, stop, started=started)
    finally:
        for task in helpers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _announce(service: Service, db: EmbeddedMariaDB, trickle: float) -> None:
    """Once the sample history is replicated, say how to connect; then keep changing data."""
    history = GtidState.parse(str(db.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]))
    await service.wait_caught_up(history)
    _print_instructions(service, db)
    if trickle > 0:
        await _trickle(db, trickle)


def _print_instructions(service: Service, db: EmbeddedMariaDB) -> None:
    assert service.listener.address is not None
    host, port = service.listener.address
    auth = auth_message(DEMO_USER, DEMO_PASSWORD).decode()
    assert service.monitoring.address is not None
    metrics = "http://{}:{}".format(*service.monitoring.address)
    assert service.admin.address is not None
    admin = "http://{}:{}".format(*service.admin.address)
    token_file = service.config.admin.token_file
    print(f"""
The CDC service is listening on {host}:{port} (user {DEMO_USER}, password {DEMO_PASSWORD}).

  Follow shop.orders with the client:
    .venv/bin/cdc -h {host} -P {port} -u {DEMO_USER} -p {DEMO_PASSWORD} shop.orders

  Start from the table's dump, then follow the changes after it:
    .venv/bin/cdc dump shop.orders --follow -o orders.dump -h {host} -P {port} \\
        -u {DEMO_USER} -p {DEMO_PASSWORD}

  Take a new dump:
    .venv/bin/cdcserver dump 'shop.*' --source {db.url()} --data-dir {service.config.store.data_dir}

  Or with netcat (the first line is hex(user:SHA1(password)); Debian: netcat-openbsd):
    printf '{auth}\\nREGISTER UUID=nc, TYPE=JSON\\nREQUEST-DATA shop.orders\\n' | nc {host} {port}

  Make your own changes in the demo database:
    mariadb --no-defaults -uroot -h127.0.0.1 -P{db.port} shop

  How the service is doing (Prometheus metrics at {metrics}/metrics):
    .venv/bin/cdcserver status --metrics-url {metrics}

  The web console, and the same from a terminal (the token is in {token_file}):
    {admin}/console/
    .venv/bin/cdcserver ctl --url {admin} --token-file {token_file} clients

Press Ctrl-C to stop.
""", flush=True)


async def _trickle(db: EmbeddedMariaDB, every: float) -> None:
    rng = random.Random()
    while True:
        await asyncio.sleep(every)
        amount = f"{rng.randint(100, 50000) / 100:.2f}"
        await asyncio.to_thread(
            db.execute,
            f"INSERT INTO shop.orders (customer_id, amount, placed) VALUES "
            f"({rng.randint(1, 3)}, {amount}, NOW(6))")


def _admin_token(directory: str) -> str:
    """The demo's admin token file (made once, readable by its owner only)."""
    path = os.path.join(directory, "admin.token")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
    return path


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
