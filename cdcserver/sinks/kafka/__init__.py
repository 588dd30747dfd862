"""The Kafka sink: every change published to Kafka, in the formats of its README.md."""
