"""ciclo against a hand-written jitted loop and Keras 3 `fit`, on the same model/data.

    KERAS_BACKEND=jax python benchmarks/vs_raw.py [--steps 2048] [--rounds 3]
    python benchmarks/vs_raw.py --model big [--shrink 1] [--steps 512]

Runs on whatever `jax.devices()[0]` is (a GPU when one is there) and names it.

Models. `digits` (default, dispatch-bound): sklearn's digits (`load_digits`,
bundled: nothing is downloaded), an MLP 64→128→10, Adam(1e-3), batch 32, softmax
cross-entropy, real numpy batches (56 full batches of one epoch, cycled). `big`
(compute-bound): an MLP 1024→4096→4096→4096→10 at batch 1024 on generated numpy
batches (8, cycled); `--shrink s` divides its widths and batch by `s` (its
FLOPs by s³) so that it runs in reasonable time on a CPU. Variants, each timed
from the first step to the final `block_until_ready` (compilation excluded: every
variant is warmed up first and reuses its compiled step):

  raw            a hand-written `for` loop over a jitted step; no host sync
  loop           `ciclo.loop` with a `managed.train_step`
  train_loop     `ciclo.train_loop` + `keras_bar` (to a StringIO) + history
  flax           the `create_flax_state` one-liner (`train_loop(state, data)`)
  fused K=32     as train_loop (bar + history, a row per step), steps_per_call=32
  flax fused     the one-liner with `create_flax_state(..., steps_per_call=32)`
  keras spe=1    Keras 3 `model.fit` (JAX backend), steps_per_execution=1
  keras spe=32   same, steps_per_execution=32

  ... prefetch=N train_loop (and fused) with the read-ahead depth forced to N
                 (0, 1, 2); the default (automatic) reads ahead only on an
                 accelerator, one batch for batches of 256 KiB or more and for
                 fused calls

Keras rows run with `--model digits` only. Calibration rows say what the machine
allows (they are not ciclo):

  raw, at most 8 calls in flight   the raw loop waiting for the loss of the
                 call 8 back before each call (ciclo's History bounds how far
                 the host runs ahead; the raw loop does not, and on a GPU
                 without preallocation a deep queue of a big model's outputs
                 makes the allocator wait: RESULTS.md, 2026-11-27)
  raw + 5 us     the raw loop plus 5 us of pure-Python busy work per step: what any
                 per-step host work costs here (the loop's own work competes with
                 the dispatch for the same cores when the step is this small);
                 `--busy-us N` sets the µs (15: the host work issue 31 allows)

`--switch-interval S` sets `sys.setswitchinterval(S)` for the whole run (the
raw loop's too): how long Python code holding the GIL (a busy loop, ciclo's
loop) keeps a thread waiting for it; a test of whether per-step host work
costs an accelerator run more than its own time because jax's threads wait for
the GIL.
  raw scan K=32  the raw step under a hand-written `jax.lax.scan` over 32 batches
                 stacked with `np.stack` per call: a fused mode fed from the host
  raw, device-resident   the raw loop over batches placed on the device before
                 the timer starts: the ceiling of any input pipeline
  raw scan K=32, device-resident   the scan over stacks placed beforehand: the
                 ceiling for a fused mode
  raw, one-ahead device_put   the raw loop placing each next batch with
                 `jax.device_put` one step ahead (the H100 experiment)
  raw, one-ahead jitted identity   the same, placing through a jitted identity
                 (the transfer of a jitted call's argument: ciclo's prefetch)

Each round runs every variant right next to a raw run (the order within the pair
alternating between rounds) and takes the ratio within the pair; the table gives
each variant's median steps/s and the median and range of its paired ratios,
and the ratio of the fastest runs (the raw loop's fastest time over the
variant's): on a shared VM noise only adds time, so with enough rounds the
fastest runs are the closest to a quiet machine's.
Results go in benchmarks/RESULTS.md by hand, with the machine and date.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import platform
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo
from ciclo import managed

BATCH = 32
K = 32
SIZES = [64, 128, 10]  # the MLP's widths; `configure` sets them per --model


def configure(model: str, shrink: int) -> None:
    """Sets the model's widths and batch size (`--model`, `--shrink`)."""
    global BATCH, SIZES
    if model == "big":
        BATCH = 1024 // shrink
        SIZES = [1024 // shrink, *[4096 // shrink] * 3, 10]
    elif shrink != 1:
        raise SystemExit("--shrink applies to --model big only")


def big_batches(count: int = 8) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` generated batches `(x (BATCH, SIZES[0]) float32, y (BATCH,) int32)`."""
    rng = np.random.default_rng(0)
    return [
        (
            rng.normal(size=(BATCH, SIZES[0])).astype(np.float32),
            rng.integers(0, SIZES[-1], BATCH).astype(np.int32),
        )
        for _ in range(count)
    ]


def digits_batches() -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    n = len(x) // BATCH
    return [
        (x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH])
        for i in range(n)
    ]


def stream(batches, steps):
    return (batches[i % len(batches)] for i in range(steps))


def init_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    params = {}
    for i, (n, m) in enumerate(itertools.pairwise(SIZES), start=1):
        scale = np.sqrt((2 if i < len(SIZES) - 1 else 1) / n)
        params[f"w{i}"] = (rng.normal(size=(n, m)) * scale).astype(np.float32)
        params[f"b{i}"] = np.zeros(m, np.float32)
    return params


def forward(params, x):
    layers = len(params) // 2
    for i in range(1, layers):
        x = jax.nn.relu(x @ params[f"w{i}"] + params[f"b{i}"])
    return x @ params[f"w{layers}"] + params[f"b{layers}"]


def xent(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


TX = optax.adam(1e-3)


# -- raw ------------------------------------------------------------------------
@jax.jit
def raw_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(lambda p: xent(forward(p, x), y))(params)
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def run_raw(batches, steps, _, step=raw_step):
    params = jax.device_put(init_params())
    opt_state = TX.init(params)
    losses = []
    for x, y in stream(batches, steps):
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(loss)
    jax.block_until_ready((params, losses))


def run_raw_bounded(batches, steps, _, in_flight: int = 8):
    """The raw loop waiting for the loss of the step `in_flight` calls back before
    the next call: the host never runs further ahead (ciclo's History bounds it
    too; an unbounded queue of a model whose outputs are large makes the
    allocator wait on a GPU without preallocation)."""
    params = jax.device_put(init_params())
    opt_state = TX.init(params)
    losses = []
    for i, (x, y) in enumerate(stream(batches, steps)):
        params, opt_state, loss = raw_step(params, opt_state, x, y)
        losses.append(loss)
        if i >= in_flight:
            losses[i - in_flight].block_until_ready()
    jax.block_until_ready((params, losses))


def run_raw_resident(batches, steps, placed):
    """The raw loop over batches already on the device (`placed`)."""
    return run_raw(placed, steps, None)


def run_raw_ahead(batches, steps, _):
    """The raw loop, each next batch placed with `jax.device_put` one step ahead."""
    params = jax.device_put(init_params())
    opt_state = TX.init(params)
    losses = []
    data = stream(batches, steps)
    ahead = jax.device_put(next(data, None))
    while ahead is not None:
        x, y = ahead
        params, opt_state, loss = raw_step(params, opt_state, x, y)
        ahead = jax.device_put(next(data, None))
        losses.append(loss)
    jax.block_until_ready((params, losses))


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


BUSY_US = 5  # the calibration row's host work per step (`--busy-us`)


def _raw_step_then_busy(params, opt_state, x, y):
    out = raw_step(params, opt_state, x, y)
    _busy(BUSY_US * 1e-6)
    return out


def run_raw_busy(batches, steps, _):
    return run_raw(batches, steps, _, step=_raw_step_then_busy)


@jax.jit
def raw_scan(params, opt_state, xs, ys):
    def body(carry, batch):
        params, opt_state, loss = raw_step(*carry, *batch)
        return (params, opt_state), loss

    (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), (xs, ys))
    return params, opt_state, losses


def run_raw_scan(batches, steps, _):
    params = jax.device_put(init_params())
    opt_state = TX.init(params)
    losses = []
    data = stream(batches, steps)
    for _ in range(steps // K):
        group = [next(data) for _ in range(K)]
        xs = np.stack([x for x, _ in group])
        ys = np.stack([y for _, y in group])
        params, opt_state, loss = raw_scan(params, opt_state, xs, ys)
        losses.append(loss)
    jax.block_until_ready((params, losses))


@jax.jit
def _identity(batch):
    return batch


def run_raw_ahead_jit(batches, steps, _):
    """The raw loop, each next batch placed one step ahead by a jitted identity
    (the implicit transfer of a jitted call: what ciclo's prefetch does)."""
    params = jax.device_put(init_params())
    opt_state = TX.init(params)
    losses = []
    data = stream(batches, steps)
    ahead = _identity(next(data))
    for batch in data:
        x, y = ahead
        params, opt_state, loss = raw_step(params, opt_state, x, y)
        ahead = _identity(batch)
        losses.append(loss)
    params, opt_state, loss = raw_step(params, opt_state, *ahead)
    losses.append(loss)
    jax.block_until_ready((params, losses))


def resident_stacks(batches):
    """`K`-batch stacks of the cycled batches, on the device (one period)."""
    period = len(batches) * K // np.gcd(len(batches), K)
    data = stream(batches, period)
    stacks = []
    for _ in range(period // K):
        group = [next(data) for _ in range(K)]
        stacks.append(
            jax.device_put(
                (np.stack([x for x, _ in group]), np.stack([y for _, y in group]))
            )
        )
    return stacks


def run_raw_scan_resident(batches, steps, stacks):
    params = jax.device_put(init_params())
    opt_state = TX.init(params)
    losses = []
    for i in range(steps // K):
        xs, ys = stacks[i % len(stacks)]
        params, opt_state, loss = raw_scan(params, opt_state, xs, ys)
        losses.append(loss)
    jax.block_until_ready((params, losses))


# -- ciclo (managed) ---------------------------------------------------------------
def _fit(state, batch):
    x, y = batch
    return ciclo.logs().add_loss("loss", xent(forward(state.params, x), y))


train_step = managed.train_step(_fit)
fused_step = managed.train_step(_fit, steps_per_call=K)


def managed_state():
    return managed.ManagedState.create(params=init_params(), tx=TX, strategy="jit")


def run_loop(batches, steps, state):
    state, history, _ = ciclo.loop(
        state, stream(batches, steps), {ciclo.every(1): train_step}
    )
    jax.block_until_ready(state)
    history.collect("loss")  # everything on the host


def _train_loop(step, **kwargs):
    def run(batches, steps, state):
        with contextlib.redirect_stdout(io.StringIO()):
            state, history, _ = ciclo.train_loop(
                state,
                stream(batches, steps),
                {ciclo.on_train_step: step},
                callbacks=[ciclo.keras_bar(total=steps)],
                **kwargs,
            )
            jax.block_until_ready(state)
            assert len(history.collect("loss")) == steps

    return run


run_train_loop = _train_loop(train_step)
run_fused = _train_loop(fused_step)
run_train_loop_ahead = _train_loop(train_step, prefetch=1)
run_fused_ahead = _train_loop(fused_step, prefetch=1)
# the read-ahead depth forced (the automatic default decides it per batch size)
run_train_loop_off = _train_loop(train_step, prefetch=0)
run_fused_off = _train_loop(fused_step, prefetch=0)
run_train_loop_ahead2 = _train_loop(train_step, prefetch=2)
run_fused_ahead2 = _train_loop(fused_step, prefetch=2)


# -- Flax one-liner -----------------------------------------------------------------
def flax_state(steps_per_call=1):
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for width in SIZES[1:-1]:
                x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(SIZES[-1])(x)

    return ciclo.create_flax_state(
        MLP(),
        jnp.ones((1, SIZES[0])),
        TX,
        losses={"loss": lambda preds, target: xent(preds, target)},
        steps_per_call=steps_per_call,
    )


def run_flax(batches, steps, state):
    state, history, _ = ciclo.train_loop(state, stream(batches, steps))
    jax.block_until_ready(state)
    history.collect("losses.loss")


# -- Keras 3 ----------------------------------------------------------------------
def keras_model(steps_per_execution):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((SIZES[0],)),
            *[keras.layers.Dense(w, activation="relu") for w in SIZES[1:-1]],
            keras.layers.Dense(SIZES[-1]),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


def run_keras(batches, steps, model):
    x = np.concatenate([b[0] for b in stream(batches, steps)])
    y = np.concatenate([b[1] for b in stream(batches, steps)])
    start = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return time.perf_counter() - start  # without building the arrays above


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="variants: a whole name picks that one, a part of a name all that hold it",
    )
    parser.add_argument("--model", choices=["digits", "big"], default="digits")
    parser.add_argument(
        "--shrink", type=int, default=1, help="divide the big model's sizes by this"
    )
    parser.add_argument(
        "--busy-us",
        type=float,
        default=5,
        help="the host work per step of the calibration row 'raw + N us' (µs)",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval for the whole run (Python's default: 0.005 s): "
        "how long a thread holding the GIL keeps a waiting one (e.g. jax's) waiting",
    )
    parser.add_argument(
        "--ratios-out",
        default=None,
        help="also write every round's paired ratios and times (JSON) to this path, "
        "to pool rounds over several runs",
    )
    args = parser.parse_args()
    global BUSY_US
    BUSY_US = args.busy_us
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if args.steps % K:
        parser.error(f"--steps must be a multiple of {K} (the fused variants' K)")
    configure(args.model, args.shrink)
    batches = digits_batches() if args.model == "digits" else big_batches()
    variants = {
        "raw jitted loop": (run_raw, lambda: None),
        f"(calibration) raw + {BUSY_US:g} us host work per step": (
            run_raw_busy,
            lambda: None,
        ),
        "(calibration) raw, at most 8 calls in flight": (
            run_raw_bounded,
            lambda: None,
        ),
        "(calibration) raw, batches already on the device": (
            run_raw_resident,
            lambda: [jax.device_put(b) for b in batches],
        ),
        "(calibration) raw, next batch device_put one step ahead": (
            run_raw_ahead,
            lambda: None,
        ),
        "(calibration) raw, next batch placed one step ahead by a jitted identity": (
            run_raw_ahead_jit,
            lambda: None,
        ),
        f"(calibration) raw step under a hand-written scan, K={K}": (
            run_raw_scan,
            lambda: None,
        ),
        f"(calibration) raw scan K={K}, stacks already on the device": (
            run_raw_scan_resident,
            lambda: resident_stacks(batches),
        ),
        "ciclo.loop (managed step)": (run_loop, managed_state),
        "train_loop + keras_bar + history": (run_train_loop, managed_state),
        "train_loop + keras_bar + history, prefetch=1": (
            run_train_loop_ahead,
            managed_state,
        ),
        "train_loop + keras_bar + history, prefetch=0": (
            run_train_loop_off,
            managed_state,
        ),
        "train_loop + keras_bar + history, prefetch=2": (
            run_train_loop_ahead2,
            managed_state,
        ),
        "create_flax_state one-liner": (run_flax, flax_state),
        f"fused K={K} (train_loop + bar + history)": (run_fused, managed_state),
        f"fused K={K}, prefetch=1": (run_fused_ahead, managed_state),
        f"fused K={K}, prefetch=0": (run_fused_off, managed_state),
        f"fused K={K}, prefetch=2": (run_fused_ahead2, managed_state),
        f"create_flax_state one-liner, fused K={K}": (run_flax, lambda: flax_state(K)),
    }
    keras = None
    if args.model == "digits":
        try:
            import keras
        except ImportError:  # e.g. a GPU machine without it: the other rows run
            print("# keras is not installed: no Keras rows")
    if keras is not None:
        variants["Keras 3 fit, steps_per_execution=1"] = (
            run_keras,
            lambda: keras_model(1),
        )
        variants[f"Keras 3 fit, steps_per_execution={K}"] = (
            run_keras,
            lambda: keras_model(K),
        )
    if args.only:  # a variant's whole name picks it alone, else a part of names
        variants = {
            k: v
            for k, v in variants.items()
            if k == "raw jitted loop"
            or any(o == k or (o not in variants and o in k) for o in args.only)
        }
    states = {}
    for name, (run, make) in variants.items():  # compile and warm up
        states[name] = make()
        run(batches, 2 * K, states[name])

    def timed(name: str) -> float:
        run = variants[name][0]
        start = time.perf_counter()
        inner = run(batches, args.steps, states[name])
        return inner if inner is not None else time.perf_counter() - start

    # Each variant runs right next to its own raw run (the order within the pair
    # alternates), and its ratio is taken within the pair: the VM's speed drifts
    # between minutes, so a ratio of two runs seconds apart is far steadier than
    # one of two medians.
    raw_name = "raw jitted loop"
    times: dict[str, list[float]] = {name: [] for name in variants}
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name in variants:
            if name == raw_name:
                continue
            if round_ % 2:
                t_variant, t_raw = timed(name), timed(raw_name)
            else:
                t_raw, t_variant = timed(raw_name), timed(name)
            times[name].append(t_variant)
            times[raw_name].append(t_raw)
            ratios[name].append(t_raw / t_variant)
    ratios[raw_name] = [1.0]
    if args.ratios_out:
        import json

        with open(args.ratios_out, "w") as f:
            json.dump(
                {
                    "ciclo": os.path.dirname(os.path.abspath(ciclo.__file__)),
                    "steps": args.steps,
                    "ratios": ratios,
                    "times": times,
                },
                f,
            )
    device = jax.devices()[0]
    model = f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}" + (
        f" (big / {args.shrink})" if args.model == "big" and args.shrink > 1 else ""
    )
    print(
        f"# {platform.node()} | {platform.processor() or platform.machine()} | "
        f"{os.cpu_count()} cpus | device: {device.device_kind} "
        f"({device.platform}, {jax.device_count()} devices) | jax {jax.__version__}"
        + (f" | keras {keras.__version__}" if keras is not None else "")
        + f" | {time.strftime('%Y-%m-%d %H:%M')} | {model} | "
        f"{args.steps} steps x {args.rounds} rounds, each paired with a raw run"
        + (
            f" | switch interval {sys.getswitchinterval():g} s"
            if args.switch_interval is not None
            else ""
        )
    )
    print()
    print(
        "| variant | steps/s (median) | × raw loop (median of pairs) | range "
        "| × raw loop (best of rounds) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in variants:
        steps_per_s = args.steps / float(np.median(times[name]))
        r = ratios[name]
        # each variant's fastest run against the raw loop's fastest: noise (other
        # load, a busy core) only adds time, so the minimum is the quiet machine's
        best = min(times[raw_name]) / min(times[name])
        print(
            f"| {name} | {steps_per_s:,.0f} | {float(np.median(r)):.2f} | "
            f"{min(r):.2f}–{max(r):.2f} | {best:.2f} |"
        )


if __name__ == "__main__":
    main()
