"""What other processes took of the host's CPU while a level ran (tuner.serving.host_cpu):
real processes on this host, this test's own children and ones outside its tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.serving.host_cpu import HostCpuSample, host_cpu_sample, others_share
from workloads.client_lag import ClientBounds, ClientVerdict, judge_client

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux /proc only")

# a child that spins for that many seconds of its own CPU time (however busy the host)
SPIN = "import time, sys\nend = float(sys.argv[1])\nwhile time.process_time() < end: pass\n"


def test_a_child_of_the_harness_counts_as_its_own() -> None:
    """A spinning child's CPU seconds are the tree's: what a load process or a simulated
    server takes is not the host's other work."""
    before = host_cpu_sample()
    assert before is not None
    subprocess.run([sys.executable, "-c", SPIN, "1.5"], check=True)
    after = host_cpu_sample()
    assert after is not None
    assert after.tree_s - before.tree_s >= 1.2  # the child's 1.5 s (waited for)
    # and one still running: counted through /proc while it lives
    child = subprocess.Popen([sys.executable, "-c", SPIN, "3"])
    try:
        time.sleep(0.3)
        start = host_cpu_sample()
        time.sleep(1.5)
        end = host_cpu_sample()
        assert start is not None and end is not None
        assert end.tree_s - start.tree_s >= 0.5  # at least a third of a core meanwhile
    finally:
        child.kill()
        child.wait()


def test_processes_outside_the_harness_are_the_hosts_other_work() -> None:
    """Spinners started outside this process's tree (their parent exits: they are
    reparented away) on every core: other processes took most of the host's CPU."""
    cores = os.cpu_count() or 1
    seconds = 2.5
    spin = f"(timeout {seconds} bash -c 'while :; do :; done' &)"
    # a shell that starts them in the background and exits at once
    subprocess.run(["bash", "-c", "; ".join([spin] * cores)], check=True)
    time.sleep(0.3)
    before = host_cpu_sample()
    time.sleep(1.5)
    after = host_cpu_sample()
    share = others_share(before, after)
    assert share is not None and share >= 0.5, share
    lag = judge_client([], ClientBounds(), None, host_others_share=share)
    # no lag: the share is recorded, not a reason
    assert lag.verdict is ClientVerdict.KEPT_UP and lag.reason is None and lag.host_busy
    time.sleep(seconds - 1.5)  # the spinners' timeout: none outlives the test


def test_a_share_needs_two_samples_over_some_time() -> None:
    sample = HostCpuSample(monotonic_s=10.0, host_busy_s=100.0, tree_s=5.0, cpus=2)
    assert others_share(None, sample) is None and others_share(sample, None) is None
    assert others_share(sample, sample) is None
    # 2 s on 2 cores: 3 busy seconds, 1 of them the tree's: others took half
    later = HostCpuSample(monotonic_s=12.0, host_busy_s=103.0, tree_s=6.0, cpus=2)
    assert others_share(sample, later) == pytest.approx(0.5)
    # never below 0 (the tree's count ran ahead of the host's by a tick) nor above 1
    ahead = HostCpuSample(monotonic_s=12.0, host_busy_s=100.5, tree_s=6.0, cpus=2)
    assert others_share(sample, ahead) == 0.0
