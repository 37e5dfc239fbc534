"""Every ```python block of README.md runs, as a reader would paste it.

Blocks of one `##` section run in order in one namespace (a section reads like a
notebook), starting from `_PRELUDE`: small stand-ins for the names the README leaves
to the reader (`state`, `train_step`, `dataset`, ...). A block right after the HTML
comment `<!-- readme: skip (why) -->` is not run; the comment says why.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys
import textwrap

import pytest
from _optional import run_or_skip

ROOT = pathlib.Path(__file__).resolve().parents[1]

_PRELUDE = textwrap.dedent(
    """
    import os
    import jax, jax.numpy as jnp, numpy as np, optax
    import ciclo

    _rng = np.random.default_rng(0)
    _x = _rng.normal(size=(96, 4)).astype(np.float32)
    _y = (_x[:, 0] > 0).astype(np.int32)
    _list = [(_x[i : i + 8], _y[i : i + 8]) for i in range(0, 96, 8)]

    def _loss_acc(w, x, y):
        logits = x @ w
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, jnp.mean(jnp.argmax(logits, -1) == y)

    @jax.jit
    def train_step(state, batch):
        (loss, acc), grad = jax.value_and_grad(_loss_acc, has_aux=True)(state, *batch)
        logs = ciclo.logs().add_loss("loss", loss).add_metric("accuracy", acc)
        return logs, state - 0.1 * grad

    @jax.jit
    def test_step(state, batch):
        loss, acc = _loss_acc(state, *batch)
        return ciclo.logs().add_loss("loss", loss).add_metric("accuracy", acc), state

    def init_state():
        return jnp.zeros((4, 2))

    state = init_state()
    dataset = data = train_batches = train_dataset = list(_list)
    batch = _list[0]
    x_train = _x
    test_batches = valid_batches = get_test_dataset = lambda: iter(_list[:4])
    data_from = lambda step: iter(_list[step:])
    steps_per_epoch, total_steps = 4, 12
    tasks = {ciclo.on_train_step: [train_step]}
    preds = jnp.zeros((8, 2))
    other_logs = ciclo.logs().add_metric("other", 1.0)
    log_learning_rate = lambda state, batch, elapsed: None
    """
)


def _sections() -> list[tuple[str, list[tuple[int, str]]]]:
    text = (ROOT / "README.md").read_text()
    out = []
    for section in re.split(r"\n(?=## )", text):
        title = section.splitlines()[0]
        blocks = []
        for match in re.finditer(
            r"(<!-- readme: skip[^>]*-->\s*)?```python\n(.*?)```", section, re.S
        ):
            if match.group(1) is None:
                line = text[: text.index(match.group(0))].count("\n") + 1
                blocks.append((line, match.group(2)))
        if blocks:
            out.append((title, blocks))
    return out


_RUNNER = textwrap.dedent(
    """
    import json, sys, textwrap, traceback
    prelude, blocks = json.loads(sys.stdin.read())
    namespace = {"__name__": "__readme__"}
    exec(prelude, namespace)
    for line, code in blocks:
        try:
            code = textwrap.dedent(code)
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        except BaseException:
            print(f"README block at line {line} failed:", file=sys.stderr)
            traceback.print_exc()
            sys.exit(1)
    """
)

SECTIONS = _sections()


@pytest.mark.parametrize("title, blocks", SECTIONS, ids=[t for t, _ in SECTIONS])
def test_readme_section_runs(title, blocks, tmp_path):
    import json

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    env["CICLO_EXAMPLE_STEPS"] = "20"
    run_or_skip(
        [sys.executable, "-c", _RUNNER],
        cwd=tmp_path,
        env=env,
        input=json.dumps([_PRELUDE, blocks]),
    )
