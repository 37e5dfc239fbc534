"""`disallow_device_to_host()`: `jax.transfer_guard_device_to_host("disallow")` that
refuses implicit device-to-host transfers on every backend, as it does on a GPU.

On a GPU or TPU it is jax's guard itself. On the CPU, jax's guard never fires
(the values already live in host memory, so `float(x)` or `x.copy_to_host_async()`
move nothing), so a test relying on it alone proves nothing there; this adds the
accelerator's rule on the CPU: while the effective device-to-host level is
"disallow", the two primitives every transfer of a jax array goes through
(the synchronous copy under `float`/`int`/`bool`/`str`/`format`/`tolist`, and
the asynchronous copy started by `copy_to_host_async`) raise unless the call is
explicit (inside `jax.device_get`). Known gap on the CPU: `np.asarray(x)` reads
a CPU array through the buffer protocol, which no Python hook sees.

The CPU emulation reads jax's guard state (`jax._src.config.guard_lib`); if a
jax version moves it, `EMULATED` is False, `disallow_device_to_host` is the plain
guard, and `tests/test_no_sync.py::test_the_guard_refuses_implicit_reads_only`
fails on the CPU, pointing here.
"""

from __future__ import annotations

import contextlib

import jax

try:
    from jax._src.config import guard_lib as _guard_lib

    _DISALLOW = _guard_lib.TransferGuardLevel.DISALLOW
    _guard_lib.thread_local_state().explicit_device_get
    EMULATED = True
except (ImportError, AttributeError):  # pragma: no cover - a future jax
    _guard_lib, EMULATED = None, False

# the methods of jax's array type that copy a device buffer to the host
_PRIMITIVES = (
    "_single_device_array_to_np_array_did_copy",
    "_copy_single_device_array_to_host_async",
)


class ImplicitTransferError(RuntimeError):
    """The CPU stand-in for jax's "Disallowed device-to-host transfer" error."""


def _refused() -> bool:
    local, shared = _guard_lib.thread_local_state(), _guard_lib.global_state()
    level = local.device_to_host
    if level is None:
        level = shared.device_to_host
    return level == _DISALLOW and not local.explicit_device_get


@contextlib.contextmanager
def disallow_device_to_host():
    """`jax.transfer_guard_device_to_host("disallow")`, enforced on the CPU too."""
    with jax.transfer_guard_device_to_host("disallow"):
        if not EMULATED or jax.default_backend() != "cpu":
            yield
            return
        array_type = type(jax.numpy.zeros(()))
        saved = {name: getattr(array_type, name) for name in _PRIMITIVES}

        def guarded(name, method):
            def call(self, *args, **kwargs):
                if _refused():
                    raise ImplicitTransferError(
                        f"Disallowed device-to-host transfer ({name}): an implicit "
                        "read of a device array under transfer_guard('disallow')"
                    )
                return method(self, *args, **kwargs)

            return call

        for name, method in saved.items():
            setattr(array_type, name, guarded(name, method))
        try:
            yield
        finally:
            for name, method in saved.items():
                setattr(array_type, name, method)
