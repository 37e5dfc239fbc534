"""Runs the multi-device workers in subprocesses (pytest-free; results cached).

The main pytest process keeps 1 CPU device; 4 forced devices and `jax.distributed`
need fresh processes.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
TIMEOUT = 240  # seconds: a hang fails the test instead of blocking CI


def _env() -> dict:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    # the workers import the ciclo of this checkout, not an installed one
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def _results(script: str, what: str, before: tuple = (), after: tuple = ()) -> dict:
    """The pickled results a worker script writes to the path it is given (its
    arguments: `*before`, the path, `*after`)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "results.pkl"
        proc = subprocess.run(
            [sys.executable, str(HERE / script), *before, str(path), *after],
            check=False,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=_env(),
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed:\n{proc.stdout}\n{proc.stderr}")
        with open(path, "rb") as f:
            return pickle.load(f)


@functools.cache
def four_device_results() -> dict:
    """Results of `_strategies_worker.py` (every strategy on 4 CPU devices)."""
    return _results("_strategies_worker.py", "4-device worker")


@functools.cache
def fused_results() -> dict:
    """Results of `_fused_worker.py` (fused vs single steps on 4 CPU devices)."""
    return _results("_fused_worker.py", "fused worker")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(script: str, *args: str, num_processes: int = 2) -> None:
    """Runs `script INDEX NUM_PROCESSES PORT *args` as `num_processes` local
    processes (one `jax.distributed` group on a free port); raises with their
    output when any fails, and kills them all on a timeout."""
    group = [str(num_processes), str(free_port())]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / script), str(i), *group, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(),
        )
        for i in range(num_processes)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    codes = [proc.returncode for proc in procs]
    if any(codes):
        raise RuntimeError(
            f"multi-process workers of {script} exited with {codes}:\n"
            + "\n".join(outputs)
        )


def multihost_params(num_processes: int = 2) -> dict[str, np.ndarray]:
    """Final params of `_multihost_worker.py` run as `num_processes` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.npz"
        run_processes("_multihost_worker.py", str(path), num_processes=num_processes)
        with np.load(path) as f:
            return dict(f)
