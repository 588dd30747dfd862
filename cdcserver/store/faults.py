"""Which faults of the store concern one table, and which every table shares.

A change the store cannot write for one table (a value its encoder refuses, rows that do not
decode, a file of its own that cannot be created) quarantines that table and every other goes
on; a full or failing disk, a store in a state it does not know, stops the store.
"""

from __future__ import annotations

import errno
import struct

from cdcserver.core.errors import StoreError, UndecodableEvent

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What writing one table's change can raise that concerns that table only: a value its
# encoder does not take, rows that do not decode, a file of its own that cannot be created or
# written (a name, a permission). Not a full or failing disk, which every table shares.
TABLE_FAULTS = (TypeError, ValueError, OverflowError, ArithmeticError, KeyError, IndexError,
                AttributeError, struct.error, UndecodableEvent, StoreError, OSError)
_SHARED_ERRNOS = (*DISK_FULL_ERRNOS, errno.EIO, errno.EROFS, errno.EMFILE, errno.ENFILE,
                  errno.ENOMEM)


class TableFault(StoreError):
    """One table cannot be stored any more (it used up its version numbers...)."""


def concerns_one_table(exc: BaseException) -> bool:
    """Whether a fault raised writing one table's change is that table's alone."""
    if not isinstance(exc, TABLE_FAULTS):
        return False
    if isinstance(exc, OSError) and exc.errno in _SHARED_ERRNOS:
        return False
    return not isinstance(exc, StoreError) or isinstance(exc, TableFault)
