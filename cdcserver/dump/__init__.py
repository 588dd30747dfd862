"""Consistent snapshots of tables (dumps): taking them, their files, the schedule, and the
retention of dumps and of the table versions they replace."""
