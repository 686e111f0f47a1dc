"""The stall report: a rank that makes no progress writes its threads' stacks, and only then."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from easyr1.stalls import progress, stall_reports

    def making_progress():
        with stall_reports(1.0):
            for _ in range(8):  # 1.6 s in all, never 1 s without progress
                time.sleep(0.2)
                progress()

    def held_here():
        with stall_reports(0.3):
            time.sleep(1.0)

    making_progress()
    print("progressed", file=sys.stderr, flush=True)
    held_here()
    print("left", file=sys.stderr, flush=True)
    progress()  # outside a block: no timer to restart
    with stall_reports(0):  # off
        time.sleep(0.7)
    time.sleep(0.7)  # past two of held_here's periods
    """
)


def test_only_a_stalled_stretch_is_reported_and_each_period_again() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    before, rest = done.stderr.split("progressed\n")
    held, after = rest.split("left\n")
    assert before == ""  # restarted every 0.2 s, the 1 s timer never fired
    reports = held.split("Timeout (0:00:00.300000)!\n")[1:]
    assert len(reports) >= 2, held  # 1.0 s held: at 0.3, 0.6 and 0.9 s
    assert all("in held_here" in report and "in making_progress" not in report for report in reports)
    assert after == ""  # the block's end stopped the timer; nothing restarted it
