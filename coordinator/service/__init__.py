"""The coordinator's I/O shell: the Faust app, its runtime (bytes in, messages out), its web views
and a supervisor that runs it as a child process. The pure core stays in :mod:`coordinator.core`."""
