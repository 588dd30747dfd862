"""Binlog event and column type numbers.

Event types: MySQL ``libbinlogevents/include/binlog_event.h`` and MariaDB ``sql/log_event.h``.
Column types: ``include/mysql_com.h`` (``enum_field_types``); what each means, from its table-map
metadata to its Avro type, is in the type table, :mod:`mariadb_cdc_client.format.coltypes`.
"""

from __future__ import annotations

from enum import IntEnum

from mariadb_cdc_client.format import coltypes


class EventKind(IntEnum):
    UNKNOWN = 0x00
    START_V3 = 0x01
    QUERY = 0x02
    STOP = 0x03
    ROTATE = 0x04
    INTVAR = 0x05
    LOAD = 0x06
    SLAVE = 0x07
    CREATE_FILE = 0x08
    APPEND_BLOCK = 0x09
    EXEC_LOAD = 0x0A
    DELETE_FILE = 0x0B
    NEW_LOAD = 0x0C
    RAND = 0x0D
    USER_VAR = 0x0E
    FORMAT_DESCRIPTION = 0x0F
    XID = 0x10
    BEGIN_LOAD_QUERY = 0x11
    EXECUTE_LOAD_QUERY = 0x12
    TABLE_MAP = 0x13
    PRE_GA_WRITE_ROWS = 0x14
    PRE_GA_UPDATE_ROWS = 0x15
    PRE_GA_DELETE_ROWS = 0x16
    WRITE_ROWS_V1 = 0x17
    UPDATE_ROWS_V1 = 0x18
    DELETE_ROWS_V1 = 0x19
    INCIDENT = 0x1A
    HEARTBEAT = 0x1B
    IGNORABLE = 0x1C
    ROWS_QUERY = 0x1D
    WRITE_ROWS_V2 = 0x1E
    UPDATE_ROWS_V2 = 0x1F
    DELETE_ROWS_V2 = 0x20
    GTID = 0x21
    ANONYMOUS_GTID = 0x22
    PREVIOUS_GTIDS = 0x23
    TRANSACTION_CONTEXT = 0x24
    VIEW_CHANGE = 0x25
    XA_PREPARE = 0x26
    PARTIAL_UPDATE_ROWS = 0x27
    TRANSACTION_PAYLOAD = 0x28
    HEARTBEAT_V2 = 0x29
    # MariaDB
    ANNOTATE_ROWS = 0xA0
    BINLOG_CHECKPOINT = 0xA1
    MARIADB_GTID = 0xA2
    GTID_LIST = 0xA3
    START_ENCRYPTION = 0xA4
    QUERY_COMPRESSED = 0xA5
    WRITE_ROWS_COMPRESSED_V1 = 0xA6
    UPDATE_ROWS_COMPRESSED_V1 = 0xA7
    DELETE_ROWS_COMPRESSED_V1 = 0xA8
    WRITE_ROWS_COMPRESSED = 0xA9
    UPDATE_ROWS_COMPRESSED = 0xAA
    DELETE_ROWS_COMPRESSED = 0xAB


# Header flag: an event a replica may skip if it does not know its type
# (MySQL LOG_EVENT_IGNORABLE_F); any other unknown event stops replication.
LOG_EVENT_IGNORABLE_F = 0x80

# Rows event flag: the last rows event of a statement.
STMT_END_F = 0x01
NO_FOREIGN_KEY_CHECKS_F = 0x02  # the session had foreign_key_checks=0: no cascades ran

# MariaDB GTID event flags (sql/log_event.h, Gtid_log_event).
FL_STANDALONE = 0x01
FL_GROUP_COMMIT_ID = 0x02
FL_TRANSACTIONAL = 0x04
FL_DDL = 0x20
FL_PREPARED_XA = 0x40
FL_COMPLETED_XA = 0x80


class ColumnType(IntEnum):
    DECIMAL = 0
    TINY = 1
    SHORT = 2
    LONG = 3
    FLOAT = 4
    DOUBLE = 5
    NULL = 6
    TIMESTAMP = 7
    LONGLONG = 8
    INT24 = 9
    DATE = 10
    TIME = 11
    DATETIME = 12
    YEAR = 13
    NEWDATE = 14
    VARCHAR = 15
    BIT = 16
    TIMESTAMP2 = 17
    DATETIME2 = 18
    TIME2 = 19
    JSON = 245
    NEWDECIMAL = 246
    ENUM = 247
    SET = 248
    TINY_BLOB = 249
    MEDIUM_BLOB = 250
    LONG_BLOB = 251
    BLOB = 252
    VAR_STRING = 253
    STRING = 254
    GEOMETRY = 255


# Which types the optional metadata gives a SIGNEDNESS bit or a character set (MySQL
# is_numeric_type, is_character_type): the type table's columns.
NUMERIC_TYPES = frozenset(ColumnType(code) for code in coltypes.codes(numeric=True))
CHARACTER_TYPES = frozenset(ColumnType(code) for code in coltypes.codes(character=True))

BINARY_COLLATION_ID = 63
