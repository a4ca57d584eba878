"""``CoordinatorProcess`` (the demo's, the tests' and the benchmarks' way to run a worker) chooses its
web port with :func:`free_port`, which can only say what is free at that moment: another process may
bind it before the worker does. Then it chooses again, instead of failing the run."""

from __future__ import annotations

import socket

from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import HOST


def test_a_worker_whose_chosen_port_was_taken_meanwhile_starts_on_another(
    bootstrap: str, topic_prefix: str
) -> None:
    # given: a worker whose chosen web port another process binds before the worker starts
    process = CoordinatorProcess(bootstrap, topic_prefix)
    taken = process.web_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind((HOST, taken))
        squatter.listen()
        # when: it starts
        with process:
            # then: it serves its views on another port, its first process having exited saying why
            assert process.web_port != taken
            assert process.get("/ready")["recovered"] is True
            assert "address already in use" in process.log_path.read_text().lower()


def test_a_port_given_to_the_worker_is_never_changed(bootstrap: str, topic_prefix: str) -> None:
    # given: a port given by its caller, taken by another process
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind((HOST, 0))
        squatter.listen()
        given = squatter.getsockname()[1]
        process = CoordinatorProcess(bootstrap, topic_prefix, web_port=given)
        # when / then: it fails saying why, on that port
        try:
            process.start(timeout=60)
        except RuntimeError as error:
            assert "address already in use" in str(error).lower()
        else:
            process.stop()
            raise AssertionError("a worker started on a port another process holds")
        assert process.web_port == given
