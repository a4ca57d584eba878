"""The checkpoint coordinator, by role: :mod:`coordinator.core` (pure decisions), :mod:`coordinator.replay`
(the journal offline), :mod:`coordinator.simulation` (the deterministic simulator of the shipped
worker), :mod:`coordinator.service` (the Faust worker, its web views and ``doctor``) and
:mod:`coordinator.cli` (the command line)."""
