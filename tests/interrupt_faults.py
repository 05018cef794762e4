"""Fault injection for issue 25's interrupt and thread items; prints the counts.

    python tests/interrupt_faults.py [--unguarded]

1. SIGINT sent at random times (another thread) while the main thread runs three-call Adam
   steps: after each KeyboardInterrupt, are the arrays exactly ``t`` whole steps?
2. Checkpoints (``state_dict``) taken by the main thread while another thread steps: is each
   one exactly the state after its ``t`` steps?
``--unguarded`` calls the methods without their guard (``__wrapped__``): the behaviour before
the fix.  tests/test_optimizer_concurrency.py runs smaller versions of both as tests.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # these tests, and the checkout's fastadam
from test_optimizer_concurrency import Reference, state_of, two_group_adam  # noqa: E402

from fastadam.optim import Optimizer  # noqa: E402


def interrupts(count, guarded):
    opt, params, grads = two_group_adam()
    step = opt.step if guarded else (lambda g: Optimizer.step.__wrapped__(opt, g))
    ref = Reference()
    delays = np.random.default_rng(1).uniform(0.0005, 0.004, count)
    stepping = threading.Event()

    def ctrl_c():
        for d in delays:
            stepping.wait()
            stepping.clear()
            time.sleep(d)
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=ctrl_c)
    thread.start()
    seen = torn = 0
    while seen < count:
        try:
            stepping.set()
            while True:
                step(grads)
        except KeyboardInterrupt:
            seen += 1
            try:
                ref.assert_matches(opt.t, *state_of(opt, params))
            except AssertionError:
                torn += 1
                opt, params, grads = two_group_adam()  # start again from a consistent state
                step = opt.step if guarded else (lambda g: Optimizer.step.__wrapped__(opt, g))
                ref = Reference()
    thread.join()
    return seen, torn


def checkpoints(count, guarded):
    opt, params, grads = two_group_adam()
    take = opt.state_dict if guarded else (lambda: Optimizer.state_dict.__wrapped__(opt))
    step = opt.step if guarded else (lambda g: Optimizer.step.__wrapped__(opt, g))
    stop = threading.Event()
    thread = threading.Thread(target=lambda: [step(grads) for _ in iter(stop.is_set, True)])
    thread.start()
    states = []
    try:
        for _ in range(count):
            states.append(take())
            time.sleep(0.002)
    finally:
        stop.set()
        thread.join()
    ref, torn = Reference(), 0
    for s in sorted(states, key=lambda s: s["t"]):
        _, slots = ref.at(s["t"])
        if not all(np.array_equal(a, b) for name in slots for a, b in zip(s[name], slots[name])):
            torn += 1
    return count, torn


if __name__ == "__main__":
    guarded = "--unguarded" not in sys.argv
    print(f"guarded={guarded}")
    seen, torn = interrupts(40, guarded)
    print(f"SIGINT during three-call steps: {seen} interrupts, {torn} left a torn state")
    n, torn = checkpoints(40, guarded)
    print(f"state_dict while another thread steps: {n} checkpoints, {torn} torn")
