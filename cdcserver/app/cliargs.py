"""What the ``cdcserver`` commands share: the flags of the source and the data directory,
as ``config.py`` declares them, and the reading of a table name or a data directory given on
the command line."""

from __future__ import annotations

import argparse
import os

from cdcserver.core import config as cfg
from cdcserver.core.errors import ConfigError
from cdcserver.core.names import TableName
from mariadb_cdc_client.format.names import BadTableRef, parse_table

CAPTURE_OPTIONS = ("capture.include", "capture.exclude", "capture.system_tables",
                   "capture.columns_exclude", "capture.columns_hash", "capture.columns_mask",
                   "capture.hash_salt_file")


def source_and_store_options(parser: argparse.ArgumentParser, *more: str) -> None:
    """--config, and the flags of the source and data directory settings (and ``more``), as
    config.py declares them."""
    cfg.add_config_flag(parser)
    cfg.add_arguments(parser, ["source.url", "source.password_file", "store.data_dir", *more])


def existing_data_dir(path: str) -> str:
    """A data directory a command reads: a missing one is a mistyped path, not an empty
    directory."""
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise ConfigError(f"store.data_dir {os.path.abspath(path)} {what}: give the service's "
                          "data directory (--data-dir, or data_dir in [store] of --config)")
    return path


def table_name(text: str) -> TableName:
    """``db.table`` as protocol.md's names grammar reads it (```my.db`.t``)."""
    try:
        ref = parse_table(text)
    except (BadTableRef, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return TableName(ref.database, ref.table)
