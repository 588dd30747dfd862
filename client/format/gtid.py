"""GTID and GTID-state syntax, as commands carry them and the service stores them.

MariaDB names a transaction ``domain-server_id-sequence``; MySQL ``source_uuid:number``. A GTID
state is a comma-separated list: one MariaDB GTID per domain, or MySQL's ``uuid:1-N`` sets.
"""

from __future__ import annotations

import re

MARIADB_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")
MYSQL_GTID = re.compile(r"^([0-9a-fA-F-]{36}):(\d+)$")
MYSQL_SET_ITEM = re.compile(r"^([0-9a-fA-F-]{36}):(?:1-)?(\d+)$")  # what the service stores
MYSQL_STATE_ITEM = re.compile(r"^([0-9a-fA-F-]{36}):(?:\d+-)?(\d+)$")  # what commands accept


def is_gtid(text: str) -> bool:
    """``D-S-N`` or ``uuid:N``."""
    return bool(MARIADB_GTID.match(text) or MYSQL_GTID.match(text))


def is_gtid_state(text: str) -> bool:
    """A non-empty comma-separated list of GTIDs (MySQL: ``uuid:N`` or ``uuid:M-N``)."""
    return bool(text) and all(MARIADB_GTID.match(item) or MYSQL_STATE_ITEM.match(item)
                              for item in text.split(","))
