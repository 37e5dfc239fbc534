"""Ctrl-C as a save starts, TRIES times: `python _sigint_save_worker.py DIR TRIES`.

Each try runs `ciclo.loop` with a checkpoint after its first batch (step 1, in a
200-step loop whose later steps wait 1 ms, so that the interrupt lands in the loop) into its own
folder of DIR, and sends this process a real SIGINT at the start of that save: an
even try from inside orbax's `CheckpointManager.save` as it is entered, an odd try
from a timer armed as the checkpoint's call begins, after 0.2-4 ms (ciclo's
preparation of the save or orbax's start; armed inside the call, so that a loaded
machine cannot fire it before the save was asked for); tries from the 21st on send it as the
loop's end waits for the save (`wait_until_finished`). Prints one JSON line per try: the step
the loop returned at, the steps of the folder, and the step `ciclo.restore` reads
with whether its state is the one trained to that step.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import ciclo

directory, tries = sys.argv[1], int(sys.argv[2])
START = 20  # the tries from this one on: Ctrl-C as the loop's end waits instead
ORIGINAL = ocp.CheckpointManager.save
armed = {"enter": False, "wait": False, "timer": None}


def interrupt() -> None:
    os.kill(os.getpid(), signal.SIGINT)


WAIT = ocp.CheckpointManager.wait_until_finished


def save(self, *args, **kwargs):
    if armed["enter"]:
        armed["enter"] = False
        interrupt()  # handled at the next bytecode: inside orbax's save
    return ORIGINAL(self, *args, **kwargs)


def wait_until_finished(self):
    if armed["wait"]:
        armed["wait"] = False
        interrupt()  # as the loop's end waits for the save
    return WAIT(self)


ocp.CheckpointManager.save = save
ocp.CheckpointManager.wait_until_finished = wait_until_finished


def train_step(state, batch):
    if batch > 1:
        time.sleep(0.001)
    return {"w": state["w"] + batch, "ballast": state["ballast"]}


def arming(i):
    def arm(state, batch):
        if i >= START:
            return
        if i % 2 == 0:
            armed["enter"] = True
        else:
            armed["timer"] = 0.0002 * i

    return arm


def arm_end():
    armed["wait"] = True  # the loop's end hooks wait for the save next


for i in range(tries):
    folder = os.path.join(directory, str(i))
    ckpt = ciclo.checkpoint(folder)
    call = ckpt.__loop_callback__
    entered = threading.Event()

    def timer(delay, entered=entered):
        entered.wait()  # the save is asked for from here on
        time.sleep(delay)
        interrupt()

    def timed_call(loop_state, call=call, entered=entered):
        delay, armed["timer"] = armed["timer"], None
        if delay is not None:  # a thread already running: nothing to wait for here
            threading.Thread(target=timer, args=(delay,), daemon=True).start()
            entered.set()
        return call(loop_state)

    ckpt.__loop_callback__ = timed_call
    arm = arming(i)
    init = {"w": jnp.zeros(4), "ballast": jnp.zeros((256, 256))}
    _, _, elapsed = ciclo.loop(
        init,
        range(1, 201),
        {ciclo.every(1): train_step, ciclo.every(1000): [arm, ckpt]},
        on_end=arm_end if i >= START else None,
    )
    expected = np.full(4, 1, np.float32)  # the save after batch 1
    try:
        restored, at = ciclo.restore(folder, init)
        step, exact = int(at.steps), np.array_equal(restored["w"], expected)
    except ValueError as error:  # no checkpoint there
        step, exact = str(error), False
    print(
        json.dumps(
            {
                "try": i,
                "returned": int(elapsed.steps),
                "folder": sorted(os.listdir(folder)),
                "restored": step,
                "exact": bool(exact),
            }
        ),
        flush=True,
    )
