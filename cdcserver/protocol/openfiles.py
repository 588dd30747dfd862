"""The stored files a stream holds open, counted in the service's budget of them
(``store/inuse.py``), and the client's refusal once that budget is spent."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import BinaryIO

from cdcserver.store.inuse import FILES, TooManyOpen, in_use
from mariadb_cdc_client.format.wire import Code, ProtocolError


def files_spent(exc: TooManyOpen) -> ProtocolError:
    """The refusal of a reader past the budget of stored files open (retriable)."""
    return ProtocolError(Code.TOO_MANY_CONNECTIONS, f"{exc.strerror}: try again later",
                         fatal=True)


@contextlib.contextmanager
def dump_in_use(path: str, layout: bool) -> Iterator[BinaryIO]:
    """A dump marked in use while it is sent, on a descriptor of its own (its databus layout
    is read from it by position, on a thread), counted in the budget of stored files open
    with, when the client asked for that ``layout``, the temporary file that holds it; past
    the budget, the client is refused in-band."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(FILES.counted(int(layout)))
            f = stack.enter_context(in_use(path))
        except TooManyOpen as exc:
            raise files_spent(exc) from None
        yield f
