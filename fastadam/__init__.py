"""fastadam: fused, exact, multi-threaded Adam for NumPy arrays on the CPU."""
__version__ = "0.1.0"

from ._dense_api import step_inplace
from ._indexed_slices import IndexedSlices
from ._optimizer import Adam
from ._show_config import config, show_config
from . import autodiff

__all__ = ["Adam", "IndexedSlices", "autodiff", "config", "show_config", "step_inplace"]
