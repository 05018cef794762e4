"""fastadam.optim: the optimizers, in a functional form and as objects.

- ``_coefficients.py``: each optimizer's hyper-parameter checks and float64 folding into the
  coefficient object its kernels read (one place per rule).
- ``_functional.py``: the functional dense steps (``step_inplace`` for Adam,
  ``adagrad_step_inplace``, ``momentum_step_inplace``): validate, fold, one compiled call.
- ``_sparse_functional.py``: their sparse forms (``sparse_step_inplace``,
  ``sparse_adagrad_step_inplace``, ``sparse_momentum_step_inplace``) on the gradient types of
  :mod:`fastadam.sparse`.
- ``optimizer_spec(name)`` (public): each optimizer's ``OptimizerSpec`` (slot names for the
  functional steps and the objects, flags, fold, ONNX operator and torch class names), for the
  tables of front-ends (fastadam/_core/_registry.py holds them);
- ``_embedding_bag.py``: ``embedding_bag_step_inplace``, the backward of pooled embedding
  lookups (``nn.EmbeddingBag``) fused with a lazy sparse step of any registered optimizer;
  ``embedding_bag_slots`` (public), the state it needs, for front-ends.
- ``_prepared.py``: ``prepare_step``, the public prepared step (arrays checked once, then
  fold-and-call per step) for front-ends that step the same arrays many times.
- ``sigint_deferred`` (public, ``_guard.py``): a context manager that delivers a Ctrl-C arriving
  inside it when it ends, for front-ends whose step makes several compiled calls.
- The optimizer objects are built on those functions only:

  - ``_base.py``: ``Optimizer`` (groups, state slots, ``t``, the step driver, setters);
  - ``_adam.py`` (``Adam``, ``AdamW``, ``SparseAdam``), ``_adagrad.py`` (``Adagrad``), ``_sgd.py`` (``SGD``):
    one small class per optimizer: its hyper-parameters, slots and functional calls;
  - ``_params.py``: parameter and gradient checks; ``_clip.py``: global-norm clipping;
  - ``_checkpoint.py``: state dicts and atomic, untrusting checkpoint files;
  - ``schedules.py`` (public): learning-rate schedules; ``_torch.py``: import from torch.optim.

A new optimizer adds its element formula and coefficient struct (``include/fastadam/<name>.h``),
one row in the registration list ``include/fastadam/optimizers.def`` (which generates the kernel
tables, the sparse switch and the CUDA dispatch), and one module here holding its fold, its
spec (``fastadam/_core/_registry.py``), its functional steps and its class on ``Optimizer``
(``_rmsprop.py`` and ``_lion.py`` are the examples), then exports the public names here and in
``fastadam/__init__.py``.  A row-wise optimizer (one state value per row) writes a row function
instead of an element function and a ``FA_ROWWISE_OPTIMIZER`` row (``_rowwise_adagrad.py``).
"""
from ._functional import adagrad_step_inplace, momentum_step_inplace, step_inplace
from ._sparse_functional import (sparse_adagrad_step_inplace, sparse_momentum_step_inplace,
                                 sparse_step_inplace)
from . import schedules
from ._adagrad import Adagrad
from ._adam import Adam, AdamW, SparseAdam
from ._base import Optimizer, ParamGroup
from ._clip import clip_grad_norm, global_norm
from ._sgd import SGD
from ._rmsprop import RMSprop, rmsprop_step_inplace, sparse_rmsprop_step_inplace
from ._lion import Lion, lion_step_inplace, sparse_lion_step_inplace
from ._rowwise_adagrad import (RowWiseAdagrad, rowwise_adagrad_step_inplace,
                               sparse_rowwise_adagrad_step_inplace)
from ._prepared import PreparedStep, prepare_step
from ._embedding_bag import embedding_bag_slots, embedding_bag_step_inplace
from ._guard import sigint_deferred
from .._core._lowp_state import QuantizedState
from .._core._registry import OptimizerSpec, spec as optimizer_spec

__all__ = ["adagrad_step_inplace", "momentum_step_inplace", "sparse_adagrad_step_inplace",
           "sparse_momentum_step_inplace", "sparse_step_inplace", "step_inplace"]
__all__ += ["lion_step_inplace", "rmsprop_step_inplace", "sparse_lion_step_inplace",
            "sparse_rmsprop_step_inplace", "Lion", "OptimizerSpec", "PreparedStep", "RMSprop", "optimizer_spec",
            "prepare_step", "QuantizedState", "sigint_deferred"]
__all__ += ["embedding_bag_slots", "embedding_bag_step_inplace"]
__all__ += ["RowWiseAdagrad", "rowwise_adagrad_step_inplace",
            "sparse_rowwise_adagrad_step_inplace"]
__all__ += ["Adagrad", "Adam", "AdamW", "Optimizer", "ParamGroup", "SGD", "SparseAdam",
            "clip_grad_norm", "global_norm", "schedules"]
