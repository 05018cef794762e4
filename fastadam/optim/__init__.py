"""fastadam.optim: the optimizers, in a functional form and as objects.

Layout: ``_functional.py`` holds the functional steps (``step_inplace`` for Adam,
``adagrad_step_inplace``, ``momentum_step_inplace`` and their sparse forms), each one
validated, folded and dispatched to one compiled call.  The optimizer objects are built on
those functions only.
"""
from ._functional import *  # noqa: F401,F403
from ._functional import __all__
