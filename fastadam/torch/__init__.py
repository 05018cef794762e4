"""fastadam.torch: fastadam's fused CPU optimizers as real ``torch.optim.Optimizer`` subclasses.

Change one import and a PyTorch training script runs on fastadam's kernels, with its LR
schedulers, ``torch.amp.GradScaler``, closures, ``zero_grad`` and ``state_dict`` as before::

    from fastadam.torch import AdamW      # was: from torch.optim import AdamW

The parameters and the state tensors are updated in place through NumPy views of CPU tensors
(no copy); the state keeps torch's names, so checkpoints move between ``torch.optim`` and
``fastadam.torch`` both ways.  A step is all or nothing: every check of every group runs
before the first write, and a Ctrl-C arrives after the whole step.  Sparse gradients
(``nn.Embedding(sparse=True)``) take fastadam's lazy sparse step.

Parameters are CPU tensors of float32, float64, float16, bfloat16 or complex dtype:

- float16 and bfloat16 are computed in float32 with states in the parameter's dtype, rounded to
  nearest even, as ``torch.optim.Adam(fused=True)`` does (bfloat16 needs ``ml_dtypes``, the
  ``bfloat16`` extra); ``state_dtype="float32"`` keeps float32 states and
  ``master_weights=True`` a float32 master copy (``state["master_param"]``) of bfloat16
  parameters;
- complex parameters step as torch steps them (``torch.view_as_real``);
- non-contiguous parameters (channels_last convolution weights, transposed views) step through
  a contiguous copy written back after the step.

``state_dtype="bfloat16"`` or ``"int8"`` (float32 or bfloat16 parameters) keeps smaller
states: bfloat16 tensors, or uint8 codes with float32 ``<name>_scales`` (block-wise 8-bit,
parameters of 4096 elements or more); the state dicts save and load with ``torch.save``.

``FusedEmbeddingBag`` and ``FusedEmbeddingBagCollection`` are pooled embedding tables whose
backward is the optimizer step (as FBGEMM's table-batched embedding): the tables are buffers
updated in place, never a gradient.

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
from ._embedding import FusedEmbeddingBag, FusedEmbeddingBagCollection

__all__ = ["Adagrad", "Adam", "AdamW", "FusedEmbeddingBag", "FusedEmbeddingBagCollection", "Lion",
           "RMSprop", "RowWiseAdagrad", "SGD", "SparseAdam"]
