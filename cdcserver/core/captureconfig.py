"""The ``[capture]`` section of the configuration (:mod:`cdcserver.core.config`): which tables are
captured, and what becomes of their columns; with the salt of hashed columns."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from cdcserver.core.errors import ConfigError
from cdcserver.core.options import (
    HASH_SALT_VARIABLE,
    column_patterns,
    mask_patterns,
    option,
    system_tables,
    table_patterns,
)


@dataclass(frozen=True)
class CaptureConfig:
    include: str = option(
        "", "the tables to capture: comma-separated db.table patterns, * for any characters "
            "in a name, a quoted name exact (e.g. shop.*,crm.customers); empty: every table",
        cli="--include", check=table_patterns)
    exclude: str = option(
        "", "tables not to capture, of those include selects: db.table patterns as include's "
            "(e.g. audit.*,shop.sessions)", cli="--exclude", check=table_patterns)
    system_tables: str = option(
        "", "tables of the system schemas (mysql, information_schema, performance_schema, "
            "sys) to capture, named one by one (db.table,...); none by default, and never "
            "mysql.global_priv or mysql.user, which hold password hashes",
        check=system_tables)
    columns_exclude: str = option(
        "", "columns never captured: comma-separated db.table.column patterns, * for any "
            "characters (e.g. shop.users.password_hash,*.*.ssn)", cli="--columns-exclude",
        check=column_patterns)
    columns_hash: str = option(
        "", "columns stored as the hex SHA-256 of the salt and the value (joins still match): "
            "db.table.column patterns; needs hash_salt_file or CDCSERVER_HASH_SALT",
        cli="--columns-hash", check=column_patterns)
    columns_mask: str = option(
        "", "columns stored masked: db.table.column patterns, each may end :N to keep the "
            "first N characters; the rest becomes *** (e.g. shop.cards.number:4)",
        cli="--columns-mask", check=mask_patterns)
    hash_salt_file: str = option(
        "", "file holding the salt of columns_hash (or the environment variable "
            "CDCSERVER_HASH_SALT); never in this file", cli="--hash-salt-file", secret=True)

    def hash_salt(self) -> bytes | None:
        """The salt of ``columns_hash``: the file's bytes (one trailing newline dropped), or
        CDCSERVER_HASH_SALT's; None when neither is set. As with the admin token's file, a
        salt file other users may read or change is refused (the salt is what keeps a
        hashed value from being found by hashing guesses), and so is one of whitespace
        only."""
        if self.hash_salt_file:
            path = self.hash_salt_file
            try:
                with open(path, "rb") as f:
                    mode = os.fstat(f.fileno()).st_mode
                    salt = f.read()
            except OSError as exc:
                raise ConfigError(f"capture.hash_salt_file: {exc}") from exc
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ConfigError(f"capture.hash_salt_file {path} may be read by other users "
                                  f"(mode {stat.S_IMODE(mode):o}); chmod 600 {path}")
            salt = salt[:-1] if salt.endswith(b"\n") else salt
            if not salt.strip():
                raise ConfigError(f"capture.hash_salt_file {path} holds no salt (empty, or "
                                  "whitespace only)")
            return salt
        value = os.environ.get(HASH_SALT_VARIABLE)
        if value is not None and value and not value.strip():
            raise ConfigError(f"{HASH_SALT_VARIABLE} holds no salt (whitespace only)")
        return value.encode("utf-8") if value else None
