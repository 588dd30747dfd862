"""The ``[kafka]`` section of the configuration (:mod:`cdcserver.core.config`): publishing every
change to Kafka as well, and how."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from cdcserver.core.options import (
    KAFKA_SASL_PASSWORD_VARIABLE,
    SCHEMA_REGISTRY_PASSWORD_VARIABLE,
    not_negative,
    option,
    positive,
    read_secret,
    table_patterns,
    time_zone,
)


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = option("", "publish every change to Kafka: HOST:PORT[,HOST:PORT...] "
                                "(empty: off)", cli="--kafka")
    format: Literal["databus", "dip", "debezium", "maxscale"] = option(
        "databus", "message format (cdcserver/sinks/kafka/README.md)", cli="--kafka-format")
    topic: str = option("auto", "topic of a table's changes; {db} and {table} are replaced (a "
                                "fixed name: one topic); auto: the format's ('databus' for "
                                "databus, else '{db}.{table}')", cli="--kafka-topic")
    ddl_topic: str = option("auto", "topic of statements that change no table (CREATE "
                                    "DATABASE...); table statements go to the table's topic; "
                                    "auto: the format's (databus: its one topic, else '{db}')")
    key: Literal["auto", "position", "primary-key"] = option(
        "auto", "message key: the change's binlog position and action, or the row's primary "
        "key; auto: the format's own (debezium: the primary key; the others: the position)")
    databus_labels: bool = option(False, "databus: ENUM and SET values as their labels instead "
                                         "of go-mysql's index and bitmask")
    key_schema: bool = option(False, "debezium: keys as Kafka Connect's JsonConverter writes "
                                     "them with schemas.enable ({\"schema\": ..., "
                                     "\"payload\": ...})")
    value_schema: bool = option(False, "debezium: values as Kafka Connect's JsonConverter "
                                       "writes them with schemas.enable: the Connect schema "
                                       "of Debezium's envelope with each value, which "
                                       "Debezium's JDBC sink needs")
    tombstones: bool = option(True, "debezium: a tombstone (the key, no value) after each "
                                    "delete, as Debezium's tombstones.on.delete (compacted "
                                    "topics drop the row)")
    truncate_events: bool = option(False, "debezium: TRUNCATE TABLE also as a change event "
                                          "(op \"t\", no key) on the table's topic, as "
                                          "Debezium sends it when skipped.operations leaves "
                                          "out \"t\"; sinks apply it (the JDBC sink's "
                                          "truncate.enabled)")
    value_format: Literal["json", "avro"] = option(
        "json", "avro: debezium values as Avro in Confluent's wire format (a magic 0 byte, "
        "the schema's 4-byte registry id, the Avro binary), each table's schema registered "
        "in schema_registry_url (the debezium format only)", cli="--kafka-value-format")
    key_format: Literal["json", "avro"] = option(
        "json", "avro: debezium primary-key keys as Avro in Confluent's wire format, the "
        "key's schema registered as the values' are (with value_format = avro)",
        cli="--kafka-key-format")
    schema_registry_url: str = option("", "schema registry with Confluent's REST API, for "
                                          "value_format = avro: http(s)://HOST:PORT[/PATH] "
                                          "(Apicurio Registry: .../apis/ccompat/v7)",
                                      cli="--kafka-schema-registry")
    subject_name_strategy: Literal["topic", "record", "topic-record"] = option(
        "topic", "registry subject of a topic's value (and key) schemas: topic: "
        "'<topic>-value' and '<topic>-key' (Confluent's TopicNameStrategy); record: the "
        "record's full name; topic-record: '<topic>-<record name>'")
    schema_compatibility: Literal["BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD",
                                  "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE",
                                  ""] = option(
        "BACKWARD", "compatibility set on each subject before its first registration ('': "
                    "the registry's own); a schema it rejects stops replication, saying why, "
                    "until the subject's compatibility lets it in")
    schema_registry_user: str = option("", "basic-auth user of the schema registry ('': no "
                                           "authentication)")
    schema_registry_password_file: str = option(
        "", "file holding the schema registry user's password (or "
            "CDCSERVER_KAFKA_SCHEMA_REGISTRY_PASSWORD)", secret=True)
    schema_topic: str = option("cdcserver-schemas", "topic of the tables' schemas, which "
                                                    "clients use to type values ('': none)")
    state_topic: str = option("cdcserver-state", "topic the sink also records its position in, "
                                                 "read back if state/kafka.json is lost ('': "
                                                 "none)")
    publisher_lock: str = option("", "with several service instances on one source: publish "
                                     "only while holding this named lock on the source "
                                     "(GET_LOCK); the others stand by and take over from "
                                     "state_topic when it is free ('': always publish)",
                                 cli="--kafka-publisher-lock")
    include: str = option("", "of the tables captured, those published: db.table patterns as "
                              "[capture] include's ('': every table captured)",
                          cli="--kafka-include", check=table_patterns)
    exclude: str = option("", "tables captured but not published: db.table patterns as "
                              "[capture] exclude's", cli="--kafka-exclude",
                          check=table_patterns)
    snapshot: Literal["never", "initial"] = option(
        "never", "initial: when the sink starts with no position (no state/kafka.json, nothing "
        "in state_topic), first publish every published table's rows as snapshot records "
        "(a chunked dump of each; debezium: op \"r\"), then its changes after its dump's "
        "point; never: changes only, from where replication stands", cli="--kafka-snapshot")
    create_topics: bool = option(True, "create missing topics")
    partitions: int = option(0, "partitions of the topics it creates (0: the format's: 1 for "
                                "databus, whose consumers read partition 0; else 3)",
                             check=not_negative)
    replication_factor: int = option(1, "replication factor of the topics it creates",
                                     check=positive)
    delivery: Literal["at-least-once", "exactly-once"] = option(
        "at-least-once", "at-least-once: a message may be sent twice after a failure "
        "(drop repeated keys); exactly-once: each transaction is published in a Kafka "
        "transaction with the position it reaches, and a read_committed consumer sees every "
        "change once (needs brokers with transactions)", cli="--kafka-delivery")
    transactional_id: str = option("", "exactly-once: the producer's transactional id and "
                                       "the key of its position in state_topic; instances "
                                       "given the same one publish the same stream, and the "
                                       "newest fences the others out ('': client_id:"
                                       "server_id, or client_id:publisher_lock)")
    transaction_timeout: float = option(60.0, "exactly-once: how long the brokers keep an "
                                              "open transaction before aborting it "
                                              "(transaction.timeout.ms)", check=positive)
    acks: Literal["all", "1", "0"] = option("all", "producer acks")
    idempotence: bool = option(True, "idempotent producer (turn off for brokers without it)",
                               cli="--kafka-idempotence")
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = option(
        "none", "compression codec (lz4 and gzip at Kafka's Java client's default levels)")
    linger_ms: int = option(5, "how long the producer waits to fill a batch")
    max_batch_bytes: int = option(256 * 1024, "largest batch per partition")
    max_message_bytes: int = option(1_000_000, "largest value of a databus message: a row "
                                               "event's message larger than this is sent as "
                                               "several, each with part of its rows (the "
                                               "brokers' message.max.bytes is 1 MiB by "
                                               "default)", check=positive)
    max_buffer_bytes: int = option(64 * 1024 * 1024, "unacknowledged message bytes held; when "
                                                     "full (a slow or absent broker), "
                                                     "replication waits")
    request_timeout: float = option(30.0, "how long a send waits for the broker's "
                                          "acknowledgement; then the sink reconnects and "
                                          "sends everything unacknowledged again")
    client_id: str = option("cdcserver", "client id, and the source name in Debezium messages")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = option(
        "PLAINTEXT", "how the producer talks to the brokers")
    ssl_cafile: str = option("", "CA bundle that signs the brokers' certificates")
    ssl_certfile: str = option("", "client certificate (mutual TLS)")
    ssl_keyfile: str = option("", "client certificate's key")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = option(
        "PLAIN", "SASL mechanism")
    sasl_username: str = option("", "SASL user")
    sasl_password_file: str = option("", "file holding the SASL password (or "
                                         "CDCSERVER_KAFKA_SASL_PASSWORD)", secret=True)
    time_zone: str = option("UTC", "zone of the dip format's TIME field and of TIMESTAMP values "
                                   "in the maxscale format (the data platform's examples are in "
                                   "UTC+8: Asia/Shanghai)", cli="--kafka-time-zone",
                            check=time_zone)

    @property
    def exactly_once(self) -> bool:
        return self.delivery == "exactly-once"

    @property
    def avro(self) -> bool:
        return self.value_format == "avro"

    def schema_registry_password(self) -> str:
        if self.schema_registry_password_file:
            return read_secret(self.schema_registry_password_file,
                               "kafka.schema_registry_password_file")
        return os.environ.get(SCHEMA_REGISTRY_PASSWORD_VARIABLE, "")

    @property
    def enabled(self) -> bool:
        return bool(self.bootstrap.strip())

    def sasl_password(self) -> str:
        if self.sasl_password_file:
            return read_secret(self.sasl_password_file, "kafka.sasl_password_file")
        return os.environ.get(KAFKA_SASL_PASSWORD_VARIABLE, "")
