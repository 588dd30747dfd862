"""The change pipeline and its sinks: the Avro store's and Kafka's (with the publisher lease
that turns it on and off), each answering the same questions (:class:`~.base.Sink`)."""
