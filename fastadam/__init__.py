"""fastadam: fused, exact, multi-threaded Adam for NumPy arrays on the CPU."""
__version__ = "0.1.0"

from ._dense_api import step_inplace
from ._indexed_slices import IndexedSlices
from ._config import keep_freed_memory
from ._show_config import config, show_config
from ._sparse_api import segment_sum, sparse_step_inplace
from . import autodiff
from .optim import Adagrad, Adam, AdamW, Optimizer, SGD, clip_grad_norm, schedules

__all__ = ["Adagrad", "Adam", "AdamW", "Optimizer", "SGD", "clip_grad_norm", "schedules", "IndexedSlices", "autodiff", "config", "keep_freed_memory", "segment_sum", "show_config",
           "sparse_step_inplace", "step_inplace"]
