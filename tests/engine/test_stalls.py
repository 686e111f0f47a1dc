"""The stall report: a rank that makes no progress writes its threads' stacks, and only then; one
that dies of a fatal signal writes them too."""

from __future__ import annotations

import os
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


CRASH = textwrap.dedent(
    """
    import faulthandler, sys
    from easyr1.stalls import stall_reports

    with stall_reports(0):  # the stall timer off: fatal signals are reported all the same
        pass
    assert not faulthandler.is_enabled()  # the block's end put it back as it was
    print("after a block", file=sys.stderr, flush=True)

    def crashes_here():
        faulthandler._sigsegv()  # a segmentation fault, as native code would raise it

    with stall_reports(0):
        crashes_here()
    """
)


def test_a_rank_killed_by_a_fatal_signal_writes_where_it_was() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}  # the block, not the variable
    done = subprocess.run([sys.executable, "-c", CRASH], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode < 0  # killed by the signal, not an exit
    before, report = done.stderr.split("after a block\n")
    assert before == ""
    assert "Fatal Python error: Segmentation fault" in report and "in crashes_here" in report


LABELLED = textwrap.dedent(
    """
    import sys, time
    from easyr1.stalls import stall_reports

    def held_here():
        with stall_reports(0.3, "[rank 3] "):
            time.sleep(0.5)

    held_here()
    print("left", file=sys.stderr, flush=True)
    """
)


def test_a_ranks_report_names_the_rank_on_every_line() -> None:
    done = subprocess.run([sys.executable, "-c", LABELLED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report, after = done.stderr.split("left\n")  # the block's end waited for the report's last line
    lines = report.splitlines()
    assert lines[0] == "[rank 3] Timeout (0:00:00.300000)!" and all(
        line.startswith("[rank 3] ") for line in lines
    )
    assert any("in held_here" in line for line in lines) and after == ""
