"""fastadam.optim: the optimizers, in a functional form and as objects.

Layout: ``_functional.py`` holds the functional steps (``step_inplace`` for Adam,
``adagrad_step_inplace``, ``momentum_step_inplace`` and their sparse forms), each one
validated, folded and dispatched to one compiled call.  The optimizer objects are built on
those functions only:

- ``_base.py``: ``Optimizer`` (groups, state slots, ``t``, the step driver, setters);
- ``_adam.py`` (``Adam``, ``AdamW``), ``_adagrad.py`` (``Adagrad``), ``_sgd.py`` (``SGD``):
  one small class per optimizer: its hyper-parameters, slots and functional calls;
- ``_params.py``: parameter and gradient checks; ``_clip.py``: global-norm clipping;
- ``_checkpoint.py``: state dicts and atomic, untrusting checkpoint files;
- ``schedules.py`` (public): learning-rate schedules; ``_torch.py``: import from torch.optim.

A new optimizer adds its functional step and one class on ``Optimizer``.
"""
from ._functional import *  # noqa: F401,F403
from ._functional import __all__ as _functional_names
from . import schedules
from ._adagrad import Adagrad
from ._adam import Adam, AdamW
from ._base import Optimizer, ParamGroup
from ._clip import clip_grad_norm, global_norm
from ._sgd import SGD

__all__ = list(_functional_names) + ["Adagrad", "Adam", "AdamW", "Optimizer", "ParamGroup", "SGD",
                                     "clip_grad_norm", "global_norm", "schedules"]
