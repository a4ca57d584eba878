"""events.stopping: a stop signal's handler takes no lock, and a wait ends when one arrives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from events.stopping import StopRequested, StopSignals


def _signal_soon(signum: int, after: float = 0.2) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(after), os.kill(os.getpid(), signum)))
    thread.start()
    return thread


class TestStopSignals:
    def test_wait_returns_when_signalled(self) -> None:
        """A SIGTERM while the main thread waits ends the wait at once, and is recorded."""
        with StopSignals() as stop:
            thread = _signal_soon(signal.SIGTERM)
            started = time.monotonic()
            assert stop.wait(10)
            took = time.monotonic() - started
            thread.join()
        assert took < 2
        assert [signal.SIGTERM] == stop.received
        assert stop.is_set()

    def test_many_signals_while_waiting_never_hang(self) -> None:
        """A storm of signals during short waits, the shape that hung ``Event.wait`` and ``set``."""
        with StopSignals() as stop:
            done = threading.Event()

            def storm() -> None:
                while not done.is_set():
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.001)

            thread = threading.Thread(target=storm)
            thread.start()
            started = time.monotonic()
            try:
                for _ in range(200):
                    stop.sleep(0.001)
            finally:
                done.set()
                thread.join()
            assert time.monotonic() - started < 5
            assert stop.requested

    def test_times_out_without_signal(self) -> None:
        """Without a signal, wait returns False after its timeout; check raises nothing."""
        with StopSignals() as stop:
            assert not stop.wait(0.05)
            stop.check()

    def test_check_raises_after_signal(self) -> None:
        """check raises StopRequested naming the signal."""
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            stop.wait(5)
            try:
                stop.check()
            except StopRequested as exc:
                assert signal.SIGTERM == exc.signum
            else:
                raise AssertionError("no StopRequested")

    def test_restores_handlers_and_wakeup_fd(self) -> None:
        """On exit the handlers and the wakeup fd are those from before."""
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        with StopSignals():
            assert before[signal.SIGTERM] != signal.getsignal(signal.SIGTERM)
        assert before == {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        assert -1 == signal.set_wakeup_fd(-1)

    def test_sigterm_stops_a_process_whose_sigint_is_ignored(self) -> None:
        """A process started with SIGINT ignored (a non-interactive shell's background job) stops on
        SIGTERM within a second, and on SIGINT as well."""
        program = textwrap.dedent(
            """
            import sys
            from events.stopping import StopSignals
            with StopSignals() as stop:
                print("ready", flush=True)
                stop.wait(30)
            print(stop.signum, flush=True)
            """
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            child = subprocess.Popen(
                [sys.executable, "-c", program],
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509
            )
            assert child.stdout is not None
            assert "ready" == child.stdout.readline().strip()
            sent = time.monotonic()
            child.send_signal(signum)
            out, _ = child.communicate(timeout=10)
            assert time.monotonic() - sent < 1
            assert 0 == child.returncode
            assert str(int(signum)) == out.strip()
