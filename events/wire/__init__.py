"""The wire contract: the records and their Avro codec, topic names, headers and reason codes, the
fencing rule, record sizes and the checks of untrusted strings (docs/wire-format.md)."""
