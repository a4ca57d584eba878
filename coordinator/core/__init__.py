"""The pure core of the coordinator: commands, checks and the decider (``decide``/``evolve``/``fold``),
the state they fold, ownership of journal partitions, restarts, admission of record sizes and the
encoding of a decision as records. No Faust, Kafka or Spark import, and no I/O."""
