"""The torch frontend's trace lock: traces run alone, runs together, and nothing deadlocks."""

from __future__ import annotations

import threading
import time

from clouseau.capture.torch._sync import TraceLock


def _join(threads: list[threading.Thread], timeout: float = 10.0) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "deadlock"


def test_runs_share_and_a_trace_runs_alone() -> None:
    lock = TraceLock()
    state = {"runs": 0, "traces": 0, "max_runs": 0}
    guard = threading.Lock()
    bad: list[str] = []

    def run() -> None:
        for _ in range(50):
            with lock.shared():
                with guard:
                    state["runs"] += 1
                    state["max_runs"] = max(state["max_runs"], state["runs"])
                    if state["traces"]:
                        bad.append("a run during a trace")
                time.sleep(0.0005)
                with guard:
                    state["runs"] -= 1

    def trace() -> None:
        for _ in range(10):
            with lock.exclusive():
                with guard:
                    state["traces"] += 1
                    if state["runs"] or state["traces"] > 1:
                        bad.append("a trace beside a run or a trace")
                time.sleep(0.001)
                with guard:
                    state["traces"] -= 1

    _join([threading.Thread(target=run) for _ in range(4)] + [threading.Thread(target=trace)])
    assert not bad and state["max_runs"] > 1  # runs did overlap


def test_two_runs_that_trace_at_once_do_not_deadlock() -> None:
    # Two threads inside an instrumented call both meet a new signature.
    lock = TraceLock()
    barrier = threading.Barrier(2)
    order: list[str] = []

    def worker(name: str) -> None:
        with lock.shared():
            barrier.wait()
            with lock.exclusive(), lock.shared(), lock.exclusive():  # re-entrant
                order.append(name)
            with lock.shared():
                order.append(name + " ran")

    _join([threading.Thread(target=worker, args=(n,)) for n in ("a", "b")])
    assert sorted(order) == ["a", "a ran", "b", "b ran"]
    assert lock._readers == 0 and lock._writer is None and lock._waiting == 0
    assert lock._mine() == 0
