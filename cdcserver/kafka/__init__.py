"""The Kafka sink: every change published to Kafka, in the formats of cdcserver/kafka/README.md."""
