"""The change records every part shares, GTIDs, errors, and the pipeline that carries a
transaction from the replicator to every sink."""
