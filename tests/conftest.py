import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test, whatever the runner started with: a suite
    started in the background (``cmd &`` in a script, some CI runners) inherits SIGINT ignored,
    and Python then installs no ``default_int_handler``.  The inherited disposition comes back
    after the test."""
    import signal

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
