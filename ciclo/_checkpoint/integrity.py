"""Checksums of a checkpoint's arrays, so that damaged bytes are never loaded.

Orbax checksums neither the raw bytes of an array nor (when a chunk is stored
uncompressed) its chunks: bytes changed inside a data file of an otherwise intact
checkpoint read back as they are. So at each save ciclo records, beside `elapsed`,
two 32-bit sums of every array's bits (`s1 = Σ v_i`, `s2 = Σ (2i + 1)·v_i` modulo
2^32 over the array's bits as 32-bit words, or 16- or 8-bit ones widened): any
changed word changes both, and bytes changed at random match with a chance of
about 2^-64. They are computed on the device, in one jitted call over the state
(the arrays are not copied to the host for it; arrays in host or CPU memory are
summed with numpy, the same sums without a compilation), and checked when the
checkpoint is read back; a difference makes it unreadable (`Unreadable`), like a
damaged file. Arrays whose dtype has no plain bit layout (complex, 4-bit) are left out, and
a state whose arrays cannot go into one call (committed to different devices) is
saved without checksums; checkpoints written without them are read as before.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["checksums", "differs"]

_DTYPES = {
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
}


def _key(entry: Any) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _arrays(state: Any) -> dict[str, Any]:
    """`{'a/b': array}` over the leaves of `state` that are checksummed."""
    out = {}
    leaves, _ = jax.tree_util.tree_flatten_with_path(state)
    for path, leaf in leaves:
        if isinstance(leaf, jax.Array):
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
        elif isinstance(leaf, np.ndarray | np.generic):
            leaf = np.asarray(leaf)
            if jax.dtypes.canonicalize_dtype(leaf.dtype) != leaf.dtype:
                continue  # would change on the way to the device (64-bit, no x64)
        else:
            continue
        if str(leaf.dtype) in _DTYPES:
            out["/".join(_key(k) for k in path)] = leaf
    return out


def _words(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = x.dtype.itemsize
    if size == 1:
        return jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32).ravel()
    if size == 2:
        return jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32).ravel()
    return jax.lax.bitcast_convert_type(x, jnp.uint32).ravel()  # 8 bytes: 2 words


@jax.jit
def _sums(arrays: list[jax.Array]) -> jax.Array:
    out = []
    for x in arrays:
        words = _words(x)
        odd = 2 * jnp.arange(words.size, dtype=jnp.uint32) + 1
        out.append(
            jnp.stack(
                [
                    jnp.sum(words, dtype=jnp.uint32),
                    jnp.sum(words * odd, dtype=jnp.uint32),
                ]
            )
        )
    return jnp.stack(out)


def _on_host(x: Any) -> bool:
    """Summed with numpy (no compilation): host arrays and arrays in CPU memory."""
    if not isinstance(x, jax.Array):
        return True
    return x.is_fully_addressable and all(d.platform == "cpu" for d in x.devices())


def _host_sums(x: Any) -> tuple[int, int]:
    """`_sums` of one array, with numpy (64-bit sums wrap: equal modulo 2^32)."""
    flat = np.asarray(x).reshape(-1)
    if flat.dtype == np.bool_:
        flat = flat.astype(np.uint8)
    words = flat.view({1: np.uint8, 2: np.uint16}.get(flat.dtype.itemsize, np.uint32))
    words = words.astype(np.uint64)
    odd = 2 * np.arange(words.size, dtype=np.uint64) + 1
    with np.errstate(over="ignore"):
        first = words.sum(dtype=np.uint64)
        second = (words * odd).sum(dtype=np.uint64)
    return int(first) & 0xFFFFFFFF, int(second) & 0xFFFFFFFF


def checksums(state: Any) -> dict[str, list[Any]] | None:
    """`{path: [dtype, shape, sums]}` of the arrays of `state`, or None (none, or
    they cannot be summed)."""
    arrays = _arrays(state)
    sums: dict[str, Any] = {}
    device = {p: x for p, x in arrays.items() if not _on_host(x)}
    if device:
        try:
            values = np.asarray(jax.device_get(_sums(list(device.values()))))
            sums.update(zip(device, values, strict=True))
        except Exception:  # e.g. committed to different devices: not summed
            pass
    for path, x in arrays.items():
        if path not in device:
            sums[path] = _host_sums(x)
    if not sums:
        return None
    return {
        path: [str(x.dtype), list(x.shape), f"{int(s[0]):08x}{int(s[1]):08x}"]
        for path, x in arrays.items()
        if (s := sums.get(path)) is not None
    }


def differs(state: Any, saved: Any) -> str | None:
    """The first array of `state` whose bits differ from the `saved` checksums
    (only arrays saved with the same dtype and shape are compared), or None."""
    if not isinstance(saved, dict) or not saved:
        return None
    now = checksums(state) or {}
    for path, (dtype, shape, sums) in now.items():
        before = saved.get(path)
        if before is None or before[:2] != [dtype, shape]:
            continue
        if before[2] != sums:
            return path or "(the root)"
    return None
