"""The listener: MaxScale's CDC protocol (sessions, streams, shared tails, dump transfers),
its users file and login throttling, and JSON rendering of stored records."""
