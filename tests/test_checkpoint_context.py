"""A checkpoint used by hand is a context manager: the block's end writes its saves
and releases the directory (API.md §6: one run per directory)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import ciclo


def test_with_block_writes_the_saves_and_releases_the_directory(tmp_path):
    with ciclo.checkpoint(tmp_path, keep=3) as ckpt:  # async saves by default
        assert isinstance(ckpt, ciclo.checkpoint)
        ckpt(ciclo.Elapsed.create(steps=3), {"w": jnp.arange(3.0)}, consumed=True)
    # another writer may claim the directory now, and finds the save written
    other = ciclo.checkpoint(tmp_path, keep=3)
    other(ciclo.Elapsed.create(steps=4), {"w": jnp.zeros(3)}, consumed=True)
    other.close()
    assert ciclo.checkpoint(tmp_path).steps() == [3, 4]
    state, elapsed = ciclo.restore(tmp_path, {"w": jnp.zeros(3)}, step=3)
    assert elapsed.steps == 3 and state["w"].tolist() == [0.0, 1.0, 2.0]


def test_with_block_closes_on_an_error(tmp_path):
    with (
        pytest.raises(RuntimeError, match="boom"),
        ciclo.checkpoint(tmp_path, keep=3) as ckpt,
    ):
        ckpt(ciclo.Elapsed.create(steps=1), {"w": jnp.ones(2)}, consumed=True)
        raise RuntimeError("boom")
    again = ciclo.checkpoint(tmp_path, keep=3)
    again(ciclo.Elapsed.create(steps=2), {"w": jnp.ones(2)}, consumed=True)
    again.close()
    assert again.steps() == [1, 2]
