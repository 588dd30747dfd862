"""Tests of the service against the suite's private MariaDB (tests/conftest.py)."""
