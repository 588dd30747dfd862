"""The stream's last transaction, held for a repair beside the stream (:mod:`.beside`).

A repair read beside the stream attaches its records, and then the table's changes it held,
to the transactions that come after the stream reached its watermark, a share to each
(:mod:`.besiderepairs`). After the source's last write there were none: the repair waited
for as many writes as it had shares, and until then no checkpoint was written, for any sink
(its change would be passed without its records), and an exactly-once Kafka transaction
stayed open.

Now, when the transaction the pipeline passes on is the last the stream has (nothing more is
handed over, or waits in the batch) and a repair beside the stream is due with shares left,
its ``Commit`` is held (:attr:`LastCommit.holding`). The pipeline applies what came before
it, then asks :meth:`LastCommit.resume` again and again: each answer is the repair's next
share, attached to that transaction as it would be to a later one (no pause: nothing else
waits), until the repair is out and the ``Commit`` follows, or until the stream brings more,
when the ``Commit`` goes at once and the rest rides on the transactions after it, as before.
A repair that failed is dealt with there too (its held statement out, its table quarantined,
or left for the pipeline to read at the next transaction). So one transaction after the
read is done is enough, however many shares the repair has. A repair queued behind the one
that ends starts at the next transaction, as before: the store must hold this one's records
first, for the view it compares with.

A transaction is not held while a repair is still being read: it would wait for the read,
and every table's consumers with it. A read that ends after the source's last transaction
waits for the next one; until then no checkpoint passes the change being repaired
(``docs/repairs.md``).

The pipeline stores every part before the held ``Commit``, so the rows not in the store are
that transaction's alone: the views a repair folds meanwhile count them once.
"""

from __future__ import annotations

import asyncio

from cdcserver.core.changes import Change, Commit
from cdcserver.reread.rereads import Rereads
from cdcserver.reread.watermark import Watermarks

RESUME_POLL = 0.05  # seconds before :meth:`LastCommit.resume` looks again after nothing


class LastCommit(Rereads, Watermarks):
    """The repair stage, with the stream's last transaction held for a repair beside it."""

    @property
    def holding(self) -> bool:
        """Whether the last transaction's ``Commit`` waits (call :meth:`resume`)."""
        return self._holding is not None

    def _hold(self, commit: Commit, open_from: int) -> bool:
        """Whether ``commit``, the last change the stream has, waits for a repair beside
        the stream; if so it is held, the rows from ``open_from`` in ``_batch_rows`` (its
        transaction's) being the only ones the store will not hold."""
        if self.input_waiting() or not self._waits_at(commit):
            return False
        self._holding = commit
        self._batch_rows = self._batch_rows[open_from:]
        return True

    async def resume(self) -> list[Change]:
        """The held transaction's next changes: a repair's next share; the ``Commit`` once
        no share is left or the stream has more."""
        commit = self._holding
        assert commit is not None
        while self._waits_at(commit) and not self.input_waiting():
            self._next_share = 0.0  # no transaction of the stream waits for its turn
            out = await self._attached_to(commit)
            if out:
                return out
            await asyncio.sleep(RESUME_POLL)  # (a failed repair dealt with: looked at again)
        self._holding = None
        out = [*self._stopping, commit]
        self._stopping = []
        return out

    def _waits_at(self, commit: Commit) -> bool:
        """Whether a repair beside the stream has more for ``commit``: it failed, or is due
        with shares left. (Not one still being read: the transaction would wait for it, and
        every table's consumers with it. Nor a read to start, a repair queued behind the
        one that ends or one the pipeline takes over: it starts at the next transaction,
        as before, with the store holding this one's records, which its view must count.)"""
        return any(r.done.is_set() and (r.error is not None or bool(r.fallback) or
                                        (r.due(commit) and not r.finished))
                   for r in self._beside.values())

    async def _attached_to(self, commit: Commit) -> list[Change]:
        """What ``commit`` gets now, as :meth:`.besiderepairs.BesideRepairs._attach_beside`
        gives it at a commit: a failed repair dealt with, or a due one's next share."""
        out = await self._attach_beside(commit)
        self._batch_rows += self._txn_rows
        self._txn_rows = []
        out += self._stopping
        self._stopping = []
        return out
