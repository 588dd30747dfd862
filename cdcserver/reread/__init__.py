"""Re-reading rows from the source at a watermark, to repair what the binlog does not carry.

Some changes reach a table without any row event: InnoDB's foreign-key cascades, partition
maintenance (``TRUNCATE``/``DROP``/``EXCHANGE PARTITION``), ALTERs that rewrite stored values
(a narrower type under a permissive ``sql_mode``, ``CONVERT TO CHARACTER SET``), ``DROP SYSTEM
VERSIONING``. The decoder recognises each where it happens and hands the pipeline a
:class:`~cdcserver.core.changes.Rowless` marker. This package brings the stream back to the table:

- :mod:`.view`: the stream's own rows of a table, as a consumer that applies the stream holds
  them (folded from the store, then kept up to date);
- :mod:`.readview`: one consistent read of the source, stamped with the binlog position and GTID
  state it is consistent at (the *watermark*), with rows in the replication's Python values;
- :mod:`.repair`: the pipeline stage that reads the affected rows at a watermark, waits for the
  stream to reach it, and emits the difference as ordinary change records;
- :mod:`.difference`: how the view differs from the rows read, and the records that say so;
- :mod:`.markers`: what a repair follows before it is read (cascades, renames, merged reads).

It is the one re-read mechanism of ``../shared/design.md``: the same steps serve any "read
these keys or ranges at a watermark and merge them with the stream".
"""
