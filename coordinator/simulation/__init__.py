"""The deterministic simulator of N coordinator workers (issue 52): the production shell
(:class:`~coordinator.service.worker.Worker`, :class:`~coordinator.service.inputs.InputLoop`,
:class:`~coordinator.service.inputs.Ticker`, :class:`~coordinator.service.runtime.Coordinator` and
the decider in it) run under one seeded scheduler over a simulated group and log.

- :mod:`coordinator.simulation.loop`: simulated time, an event loop per worker, an executor
  without threads;
- :mod:`coordinator.simulation.broker`: the in-memory log and the ports over it;
- :mod:`coordinator.simulation.files`: the file system's ports in memory (no links, metadata
  objects by URI);
- :mod:`coordinator.simulation.oracle`: the invariants;
- :mod:`coordinator.simulation.world`: one seed's world, its faults, the run.

``python -m coordinator.simulation.run`` runs seeds and replays one.
"""
