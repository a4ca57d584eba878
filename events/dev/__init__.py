"""Development helpers: the embedded broker, the participant library's example app, and a
check that a command stops in time on SIGTERM."""
