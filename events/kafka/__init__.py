"""The Kafka edge: client settings, producing records, reading topics to their end, and the one
feed every reader of a job's partitions uses (find the real end, filter, decode, fence)."""
