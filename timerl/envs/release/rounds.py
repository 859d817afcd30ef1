"""One compiled RT program run round by round: the host pauses it at round boundaries.

A tuning loop alternates between a search (here: an RT program that trains a PPO agent
over the cost model) and host work (sampling, hardware measurements, refitting the cost
model). Recompiling the program every round costs seconds; :class:`ProgramRounds`
instead compiles it once, with more iterations than the tuning can use, and runs its
:class:`~timerl.compile.Executor` in a worker thread that the program itself pauses:
an env calls :meth:`ProgramRounds.boundary` from its ``reset`` at the first iteration of
each round, which hands control back to the host and blocks until the host starts the
next round with :meth:`ProgramRounds.run_round` (whose payload ``boundary`` returns, e.g.
the refitted cost model) or ends the program with :meth:`ProgramRounds.close`.

Exactly one side runs at a time (a handshake over two queues), so the host may mutate
state the program reads (the cost model) between rounds. An error raised in the program
is re-raised on the host by ``run_round``; closing raises :class:`ProgramStopped` (a
``BaseException``, so the runtime does not wrap it as a user-code error) at the paused
boundary and joins the worker.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from timerl.errors import TimeRLError

log = logging.getLogger("timerl.envs.release")


class ProgramStopped(BaseException):
    """Raised inside the paused program when the host closes it."""


_STOP = object()


class ProgramRounds:
    """A compiled program run in a worker thread, paused between rounds (see the module doc)."""

    def __init__(self) -> None:
        self._to_program: queue.Queue[Any] = queue.Queue()
        self._to_host: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._in_round = False
        self.ended = False
        self.rounds = 0

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self, executor: Any) -> None:
        """Start ``executor.execute()`` in a worker thread; it runs until the program's first
        :meth:`boundary` and waits there for :meth:`run_round`."""
        if self._thread is not None:
            raise TimeRLError("ProgramRounds: already started")

        def work() -> None:
            try:
                executor.execute()
            except ProgramStopped:
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the host thread
                self._to_host.put(("error", exc))
                return
            self._to_host.put(("end", None))

        self._thread = threading.Thread(target=work, name="timerl-program-rounds", daemon=True)
        self._thread.start()

    def boundary(self) -> Any:
        """Called by the program (worker thread) where a round starts: ends the current round
        (the host's :meth:`run_round` returns), waits for the next one and returns its payload;
        raises :class:`ProgramStopped` when the host closes the program instead."""
        if self._in_round:
            self._to_host.put(("round", None))
        msg = self._to_program.get()
        if msg is _STOP:
            self._in_round = False
            raise ProgramStopped
        self._in_round = True
        return msg

    def run_round(self, payload: Any) -> None:
        """Run the program for one round with ``payload`` (returned by :meth:`boundary` in
        the program) and wait until it reaches the next round's boundary or its end; an error
        in the program is re-raised here."""
        if self._thread is None:
            raise TimeRLError("ProgramRounds: start(executor) before run_round")
        if self.ended:
            raise TimeRLError(
                f"ProgramRounds: the program ran all its iterations after {self.rounds} rounds; "
                "compile it with more iterations"
            )
        self._to_program.put(payload)
        kind, value = self._to_host.get()
        self.rounds += 1
        if kind == "error":
            self.ended = True
            raise value
        if kind == "end":
            self.ended = True

    def close(self) -> None:
        """Stop the paused program (if it has not ended) and join the worker thread."""
        if self._thread is None:
            return
        if not self.ended:
            self._to_program.put(_STOP)
        self._thread.join()
        self._thread = None
        self.ended = True
