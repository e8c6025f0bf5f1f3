"""Stopping runs from outside: Ctrl-C (SIGINT) and SIGTERM, what a scheduler sends before it kills a job.

Both raise ``KeyboardInterrupt`` where the process is (SIGTERM as its subclass ``Terminated``), so a run unwinds as on
Ctrl-C: its run directory's lock is released (``results.claimed``), nothing is half-written (``results.atomic_write``)
and its resume state stays. The command line then says in one line per run what it left (``resume_line``) and exits
130 after Ctrl-C, 143 after SIGTERM (128 + the signal's number, as a shell reports a process the signal killed).

``reproduce --jobs N`` runs cells in worker processes: each one stops its cell on its first signal and starts no
other (``worker_init``, ``stopping``, ``in_cell``); the parent forwards SIGTERM to them (``stop_workers``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, as Ctrl-C raises ``KeyboardInterrupt``."""


class CellInterrupted(Exception):
    """A cell of ``reproduce`` stopped by a signal: ``args = (line, exit code)``, the line being ``resume_line``'s."""

    @property
    def line(self) -> str:
        return self.args[0]

    @property
    def code(self) -> int:
        return self.args[1]


def exit_code(e: BaseException) -> int:
    """143 for SIGTERM, 130 for Ctrl-C."""
    return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED


def how(e: BaseException) -> str:
    return "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"


def _raise_terminated(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a second SIGTERM must not break the unwinding of the first
    raise Terminated()


@contextmanager
def sigterm_interrupts():
    """Inside, SIGTERM raises ``Terminated`` in the main thread (once); the previous handler is restored after. Called
    from another thread (which cannot handle signals), it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def resume_line(run_dir: Path, e: BaseException) -> str:
    """The one line an interrupted run prints: where its resume state is (``results.ResumeFiles``), or that it had
    none yet."""
    from bnnbench.run.results import ResumeFiles
    saved = ResumeFiles.in_dir(run_dir)
    if saved:
        return (f"interrupted ({how(e)}): resume state kept in {run_dir} ({', '.join(p.name for p in saved)}); "
                "the same command resumes it")
    return (f"interrupted ({how(e)}): {run_dir}: no checkpoint had been written yet; "
            "the same command starts it afresh")


_WORKER = {"stopping": False, "in_cell": False}


def _stop_worker(signum, frame):
    first = not _WORKER["stopping"]
    _WORKER["stopping"] = True
    if first and _WORKER["in_cell"]:
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def worker_init() -> None:
    """In a worker process of ``reproduce``: the first SIGINT or SIGTERM stops the cell it runs (as an interruption)
    and any later cell before it starts; while it waits for a cell, a signal only marks it as stopping."""
    signal.signal(signal.SIGINT, _stop_worker)
    signal.signal(signal.SIGTERM, _stop_worker)


def stopping() -> bool:
    """This worker has been told to stop: start no cell."""
    return _WORKER["stopping"]


@contextmanager
def in_cell():
    """A signal inside raises in this worker (outside, it only marks it as stopping)."""
    _WORKER["in_cell"] = True
    try:
        yield
    finally:
        _WORKER["in_cell"] = False


def stop_workers() -> None:
    """SIGTERM to this process's worker processes (a scheduler's SIGTERM reaches only the parent; Ctrl-C reaches all,
    and a worker stops on its first signal only)."""
    for p in multiprocessing.active_children():
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
