"""fastadam.torch: fastadam's fused CPU optimizers as real ``torch.optim.Optimizer`` subclasses.

Change one import and a PyTorch training script runs on fastadam's kernels, with its LR
schedulers, ``torch.amp.GradScaler``, closures, ``zero_grad`` and ``state_dict`` as before::

    from fastadam.torch import AdamW      # was: from torch.optim import AdamW

The parameters and the state tensors are updated in place through NumPy views of CPU tensors
(no copy); the state keeps torch's names, so checkpoints move between ``torch.optim`` and
``fastadam.torch`` both ways.  A step is all or nothing: every check of every group runs
before the first write, and a Ctrl-C arrives after the whole step.  Sparse gradients
(``nn.Embedding(sparse=True)``) take fastadam's lazy sparse step.  Parameters must be contiguous CPU tensors of float32, float64
or float16 (float16 computed in float32, state in float16 as torch keeps it).

torch is not a dependency of fastadam: install it yourself (the CPU build:
``pip install torch --index-url https://download.pytorch.org/whl/cpu``).
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "fastadam.torch needs PyTorch; install the CPU build with "
        "`pip install torch --index-url https://download.pytorch.org/whl/cpu`") from exc

from ._optimizers import Adagrad, Adam, AdamW, Lion, RMSprop, RowWiseAdagrad, SGD, SparseAdam

__all__ = ["Adagrad", "Adam", "AdamW", "Lion", "RMSprop", "RowWiseAdagrad", "SGD", "SparseAdam"]
