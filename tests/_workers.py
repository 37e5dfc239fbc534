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


def _results(script: str, what: str) -> dict:
    """The pickled results a worker script writes to the path it is given."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "results.pkl"
        proc = subprocess.run(
            [sys.executable, str(HERE / script), str(path)],
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


def multihost_params(num_processes: int = 2) -> dict[str, np.ndarray]:
    """Final params of `_multihost_worker.py` run as `num_processes` processes."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.npz"
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "_multihost_worker.py"),
                    str(i),
                    str(num_processes),
                    str(port),
                    str(path),
                ],
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
                f"multi-process workers exited with {codes}:\n" + "\n".join(outputs)
            )
        with np.load(path) as f:
            return dict(f)
