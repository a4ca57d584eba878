"""The task side: the participant library for plain Python Kafka apps, and where task snapshots
live (the local file system or any fsspec file system)."""
