"""What a ``kill -9`` loses with the default store settings (docs/errors.md quotes it).

    python -m bench.crash_loss [--kills 10] [--kib 1]

A child writes calls of one array of ``--kib`` KiB as fast as it can into a
``DirectorySink`` with the defaults (``max_size_mb=1024``, ``flush_s=FLUSH_S``); each
array holds the wall time of its call. It is killed with SIGKILL at a random time; the
loss is the time between the kill and the last call on disk, and the calls made in that
time (at the child's measured rate).
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CHILD = """
import sys, time
import numpy as np
from clouseau.ir.sink import SavedValue
from clouseau.store import DirectorySink

sink = DirectorySink(sys.argv[1])
values = np.zeros(int(sys.argv[2]) * 128)
print("ready", flush=True)
while True:
    c = sink.begin_call()
    values[0] = time.time()
    sink.put(c, 0, [SavedValue(("t",), "t", values.copy())])
    sink.end_call(c)
"""


def one_kill(seconds: float, kib: int) -> tuple[float, float]:
    """(seconds lost, calls lost) of one child killed after ``seconds``."""
    import warnings

    from clouseau.store import load

    with tempfile.TemporaryDirectory() as tmp:
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHILD), tmp, str(kib)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        started = time.time()
        time.sleep(seconds)
        killed = time.time()
        child.send_signal(signal.SIGKILL)
        child.wait()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cap = load(Path(tmp))
        if not cap.calls:
            return killed - started, float("nan")
        first = float(cap.get("t", call=cap.calls[0])[0])
        last = float(cap.get("t", call=cap.calls[-1])[0])
        rate = (len(cap.calls) - 1) / max(last - first, 1e-9)
        return killed - last, (killed - last) * rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--kib", type=int, default=1, help="KiB per call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results = [one_kill(rng.uniform(2, 8), args.kib) for _ in range(args.kills)]
    for lost_s, lost_calls in results:
        print(f"lost {lost_s:6.2f} s  ~{lost_calls:9.0f} calls")
    worst = max(results)
    print(
        f"worst of {args.kills} kills, {args.kib} KiB per call: {worst[0]:.2f} s, ~{worst[1]:.0f} calls"
    )


if __name__ == "__main__":
    main()
