"""The `sharded` strategy under `jax.distributed`: 2 processes x 2 CPU devices end
with the params of the 1 process x 4 devices run.

Each process feeds its local half of every batch; collectives go through gloo.
Slow (two fresh JAX processes) but always run.
"""

from __future__ import annotations

import numpy as np
import pytest
from _workers import four_device_results, multihost_params


@pytest.mark.slow
def test_two_processes_match_one_process_with_four_devices():
    reference = four_device_results()["params"]["sharded"]
    params = multihost_params(num_processes=2)
    loss = float(params.pop("loss"))
    assert set(params) == set(reference)
    for name in reference:
        np.testing.assert_allclose(params[name], reference[name], atol=1e-5)
    assert np.isfinite(loss)
