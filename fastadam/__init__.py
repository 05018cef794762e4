"""fastadam: fused, exact, multi-threaded optimizer steps (Adam, Adagrad, momentum SGD, RMSprop,
Lion) for
NumPy arrays on the CPU, dense and sparse, with a tape-based gradient engine.

The package is laid out by capability: ``fastadam.optim`` (optimizers: functional steps, dense
and sparse, and objects), ``fastadam.sparse`` (sparse gradients and the segment machinery),
``fastadam.autodiff`` (the gradient engine), ``fastadam.bench`` (baselines, timers, the bandwidth
yardstick; not imported here), all on ``fastadam._core`` (the compiled drivers, private).
This module only re-exports the public names.
"""
from ._version import __version__

from ._omp_wait import load_core as _load_core

_load_core()  # before anything loads libgomp: see fastadam/_omp_wait.py

from ._core._config import keep_freed_memory
from ._core._mempool import MemoryPool
from ._show_config import config, show_config
from .optim import adagrad_step_inplace, momentum_step_inplace, step_inplace
from .optim import sparse_adagrad_step_inplace, sparse_momentum_step_inplace, sparse_step_inplace
from .sparse import IndexedSlices, segment_sum
from .optim import (Adagrad, Adam, AdamW, Optimizer, SGD, SparseAdam, clip_grad_norm,
                    schedules)
from .optim import (Lion, RMSprop, lion_step_inplace, rmsprop_step_inplace,
                    sparse_lion_step_inplace, sparse_rmsprop_step_inplace)
from .optim import embedding_bag_step_inplace
from .optim import (RowWiseAdagrad, rowwise_adagrad_step_inplace,
                    sparse_rowwise_adagrad_step_inplace)
from . import autodiff

__all__ = ["Adagrad", "Adam", "AdamW", "IndexedSlices", "Lion", "MemoryPool", "Optimizer", "RMSprop",
           "RowWiseAdagrad", "SGD",
           "SparseAdam",
           "adagrad_step_inplace", "autodiff", "clip_grad_norm", "config",
           "embedding_bag_step_inplace", "keep_freed_memory",
           "lion_step_inplace", "momentum_step_inplace", "rmsprop_step_inplace",
           "rowwise_adagrad_step_inplace", "schedules",
           "segment_sum", "show_config",
           "sparse_adagrad_step_inplace", "sparse_lion_step_inplace",
           "sparse_momentum_step_inplace", "sparse_rmsprop_step_inplace",
           "sparse_rowwise_adagrad_step_inplace", "sparse_step_inplace",
           "step_inplace"]
