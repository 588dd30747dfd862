"""``cdc kafka``: the service's Kafka topics as decoded JSON lines (see ``client/cli.py``)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import uuid
from decimal import Decimal
from typing import Any

from mariadb_cdc_client.kafka import FORMATS, KafkaChange, KafkaChangeReader

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cdc kafka", description="Print the changes the service "
                                "published to Kafka, decoded, one JSON line each")
    p.add_argument("topics", nargs="+", metavar="TOPIC",
                   help="the topics to read: the service's kafka.topic with {db} and {table} "
                        "filled in (by default db.table; databus: databus)")
    p.add_argument("-b", "--bootstrap", default="localhost:9092", help="HOST:PORT[,...]")
    p.add_argument("--kafka-format", default="databus", choices=FORMATS,
                   help="the service's kafka.format")
    p.add_argument("--schema-topic", default="cdcserver-schemas",
                   help="the service's kafka.schema_topic ('': untyped values)")
    p.add_argument("--schema-registry", default="",
                   help="the service's kafka.schema_registry_url, where the schemas of Avro "
                        "values are (debezium with value_format = avro)")
    p.add_argument("--from", dest="start", default="earliest",
                   help="earliest, latest, PARTITION:OFFSET[,...] or a GTID state")
    p.add_argument("--read-committed", action="store_true",
                   help="only messages of committed Kafka transactions (the service's "
                        "kafka.delivery = \"exactly-once\": each change once)")
    p.add_argument("-t", "--timeout", type=float, default=0,
                   help="exit after this many seconds without a message (0: never)")
    p.add_argument("--security-protocol", default="PLAINTEXT",
                   choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
                   help="how to talk to the brokers (the service's kafka.security_protocol)")
    p.add_argument("--ssl-cafile", default=None, help="CA bundle of the brokers' certificates")
    p.add_argument("--sasl-mechanism", default="PLAIN",
                   choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                   help="SASL mechanism (with a SASL_* --security-protocol)")
    p.add_argument("--sasl-user", default=None, help="SASL user (password: CDC_KAFKA_PASSWORD)")
    return p


def parse_start(text: str) -> str | dict[int, int]:
    if text in ("earliest", "latest"):
        return text
    if ":" in text and all(part.count(":") == 1 and part.split(":")[0].isdigit()
                           for part in text.split(",")):
        return {int(p): int(o) for p, o in (part.split(":") for part in text.split(","))}
    from mariadb_cdc_client.format.gtid import is_gtid_state

    if not is_gtid_state(text):
        raise ValueError(f"--from {text!r}: not earliest, latest, PARTITION:OFFSET or a GTID")
    return text


def as_json(value: Any) -> Any:
    """A typed value as JSON: exact decimals as strings, bytes as hex, times as ISO 8601."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    return value


def line(c: KafkaChange) -> str:
    doc = {"topic": c.topic, "partition": c.partition, "offset": c.offset, "gtid": c.gtid,
           "event_number": c.event_number, "database": c.database, "table": c.table,
           "action": c.action}
    if c.is_statement:
        doc["sql"] = c.sql
    else:
        doc["before"], doc["after"] = as_json(c.before), as_json(c.after)
    return json.dumps(doc, ensure_ascii=False)


def consumer_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"security_protocol": args.security_protocol}
    if args.read_committed:
        options["isolation_level"] = "read_committed"
    if args.security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context

        options["ssl_context"] = create_ssl_context(cafile=args.ssl_cafile)
    if args.security_protocol.startswith("SASL"):
        options.update(sasl_mechanism=args.sasl_mechanism, sasl_plain_username=args.sasl_user,
                       sasl_plain_password=os.environ.get("CDC_KAFKA_PASSWORD", ""))
    return options


async def _print(args: argparse.Namespace) -> None:
    reader = KafkaChangeReader(args.bootstrap, args.topics, format=args.kafka_format,
                               schema_topic=args.schema_topic,
                               schema_registry_url=args.schema_registry,
                               **consumer_options(args))
    out = sys.stdout
    async for change in reader.changes(parse_start(args.start), args.timeout or None):
        out.write(line(change) + "\n")
        out.flush()


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        asyncio.run(_print(args))
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        return EXIT_OK
    except LookupError as exc:
        print(f"cdc kafka: {exc.args[0]}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as exc:
        print(f"cdc kafka: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - a connection error, said plainly
        print(f"cdc kafka: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
