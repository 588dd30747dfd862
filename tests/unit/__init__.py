"""Tests that need no server: the parts in process, sockets on 127.0.0.1 at most."""
