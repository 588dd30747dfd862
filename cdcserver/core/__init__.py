"""What every part shares: change records, table names, GTIDs, errors, the configuration's
declaration, what is captured, crash-safe writes, and the retry policy."""
