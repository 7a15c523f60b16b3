"""The CPU thread count: what the process may use, a cgroup quota, OMP_NUM_THREADS and
--threads; and torch's OpenMP waiters sleep (OMP_WAIT_POLICY=PASSIVE is set before torch loads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from chatapp.options import chat_parser
from model.cpu.threads import available_cpus, quota_cpus, use_threads


def test_a_cgroup_quota_caps_the_count(tmp_path):
    f = tmp_path / "cpu.max"
    for text, want in (("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000", 1), ("bad", None)):
        f.write_text(text)
        assert quota_cpus(f) == want
    assert quota_cpus(tmp_path / "missing") is None
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)


def test_threads_flag_env_and_default(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert use_threads(None) == available_cpus() == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert use_threads(None) == 1 == torch.get_num_threads()
        assert use_threads(2) == 2 == torch.get_num_threads()   # --threads wins
    finally:
        torch.set_num_threads(before)
    assert chat_parser().parse_args(["--threads", "3"]).threads == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            chat_parser().parse_args(["--threads", bad])


def test_openmp_waiters_sleep_in_the_app():
    """The app's entry point sets OMP_WAIT_POLICY before torch is imported (libgomp reads it
    once, when it loads); an explicit setting is left alone."""
    code = ("import sys, chatapp.cli, os; assert 'torch' not in sys.modules; import torch; "
            "print(os.environ['OMP_WAIT_POLICY'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.strip() == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "OMP_WAIT_POLICY": "ACTIVE"})
    assert out.stdout.strip() == "ACTIVE"
