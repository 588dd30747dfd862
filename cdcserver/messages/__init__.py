"""The messages a change becomes outside the Avro store: events built from the pipeline's
changes, and their formats (databus, dip, Debezium, MaxScale's KafkaCDC), which the Kafka sink
publishes and the dump layout writes."""
