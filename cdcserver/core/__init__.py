"""The change records every part shares, GTIDs, errors, the configuration's declaration, and
the pipeline that carries a transaction from the replicator to every sink."""
