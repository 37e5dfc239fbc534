"""API.md §10 — Scale-out (and the multi-device bullets of §7).

Runs a worker in a fresh process with 4 forced CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=4`` set before jax is imported).
Multi-host (``jax.distributed``, 2 local processes with gloo) is marked slow.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

_COMMON = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import jax, jax.numpy as jnp, optax
    import ciclo
    from ciclo import managed

    @managed.train_step
    def step(state, batch):
        x, y = batch
        pred = x @ state.params
        logs = ciclo.logs()
        logs.add_loss("loss", jnp.mean((pred - y) ** 2))
        logs.add_output("pred", pred)
        return logs, state

    rng = np.random.default_rng(0)
    W = np.array([1.0, -2.0, 0.5], np.float32)
    XS = rng.normal(size=(5, 8, 3)).astype(np.float32)
    BATCHES = [(x, x @ W) for x in XS]

    def run(strategy, batches):
        s = managed.ManagedState.create(params=jnp.zeros(3), tx=optax.sgd(0.1), strategy=strategy)
        for b in batches:
            logs, s = step(s, b)
        return dict(
            params=np.asarray(s.with_strategy("jit").params).tolist(),
            loss=float(logs.losses.loss),
            pred=np.asarray(logs["outputs"]["pred"]).tolist(),
        )
    """
)

_SINGLE_HOST = _COMMON + textwrap.dedent(
    """
    assert jax.device_count() == 4, jax.devices()
    res = {s: run(s, BATCHES) for s in ["jit", "sharded", "data_parallel"]}
    try:
        run("data_parallel", [(XS[0][:6], (XS[0] @ W)[:6])])
        res["uneven"] = None
    except ValueError as e:
        res["uneven"] = str(e)
    print("RESULT" + json.dumps(res))
    """
)

_MULTI_HOST = _COMMON + textwrap.dedent(
    """
    pid, port = int(sys.argv[1]), sys.argv[2]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
    local = [(x[pid * 4:(pid + 1) * 4], y[pid * 4:(pid + 1) * 4]) for x, y in BATCHES]
    print("RESULT" + json.dumps(run("sharded", local)))
    """
)


def _env(n_devices):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={n_devices} --xla_cpu_multi_thread_eigen=false"
    )
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _result(stdout):
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.fixture(scope="module")
def four_devices():
    proc = subprocess.run(
        [sys.executable, "-c", _SINGLE_HOST],
        env=_env(4),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _result(proc.stdout)


def test_sharded_and_data_parallel_give_the_jit_parameters_on_4_devices(four_devices):
    ref = np.asarray(four_devices["jit"]["params"])
    for strategy in ("sharded", "data_parallel"):
        np.testing.assert_allclose(
            four_devices[strategy]["params"], ref, rtol=1e-5, atol=1e-6
        )


def test_logs_come_back_averaged_and_outputs_concatenated(four_devices):
    ref = four_devices["jit"]
    for strategy in ("sharded", "data_parallel"):
        got = four_devices[strategy]
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5)
        assert np.shape(got["pred"]) == (8,)
        np.testing.assert_allclose(got["pred"], ref["pred"], rtol=1e-5, atol=1e-6)


def test_batch_not_splitting_evenly_is_a_clear_error(four_devices):
    msg = four_devices["uneven"]
    assert msg is not None, "a batch of 6 on 4 devices must raise ValueError"
    assert "6" in msg and "4" in msg


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sharded_multi_host_equals_single_process(four_devices):
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MULTI_HOST, str(pid), port],
            env=_env(2),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    ref = np.asarray(four_devices["jit"]["params"])
    for out, _ in outs:
        got = _result(out)
        np.testing.assert_allclose(got["params"], ref, rtol=1e-5, atol=1e-6)
        assert got["loss"] == pytest.approx(four_devices["jit"]["loss"], rel=1e-5)
