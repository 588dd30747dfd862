"""Consistent snapshots of tables (dumps): taking them, their files, and the schedule."""
