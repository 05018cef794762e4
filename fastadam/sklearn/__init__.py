"""fastadam.sklearn: scikit-learn front-end of fastadam (imported on demand; ``import fastadam``
never imports scikit-learn).

Two ways in, both on the public fastadam API only (``step_inplace``, ``sparse_step_inplace``,
``IndexedSlices``, ``autodiff``):

1. scikit-learn's own estimators, faster: ``AdamOptimizer`` is a drop-in subclass of
   scikit-learn's private MLP ``AdamOptimizer`` whose update is one fused ``step_inplace`` call
   (TF convention, same arithmetic, so the same coefficients), and ``accelerate_mlp()`` makes
   ``sklearn.neural_network.MLPClassifier/MLPRegressor(solver="adam")`` use it, and its
   mini-batch loop use ``_sk_backprop`` (scikit-learn's operations in scikit-learn's order, into
   reused buffers), inside a ``with`` block (``_accelerate``; it checks the private contract and
   fails loudly if it changed).
2. Estimators written on fastadam that pass ``check_estimator``: ``MLPClassifier`` and
   ``MLPRegressor`` (``_mlp``: a hand-written forward/backward pass, ``_backprop`` and the
   compiled ``_kernels``, equal to the autodiff tape's gradients, + the fused dense step; X's
   dtype by default, ``dtype="float32"`` for speed) and
   ``SparseLinearClassifier`` (``_sparse_linear``: CSR mini-batches give gradients only for the
   features they contain, applied by the lazy sparse step, so the cost per batch follows the
   non-zeros, not the feature count).

Losses are fused one-pass loops with sample weights (``_kernels``; the sparse model's are
autodiff primitives, ``_losses``); ``verbose`` progress
uses tqdm when installed (``_progress``).  Everything pickles and clones like any scikit-learn
estimator; under ``GridSearchCV(n_jobs=2)`` scikit-learn's default loky backend starts fresh
worker processes, which avoids libgomp's fork hazard (see docs/guide/threads.md).
"""
from ._accelerate import (AdamOptimizer, StockFallbackWarning, accelerate_mlp,
                          check_sklearn_contract)
from ._mlp import MLPClassifier, MLPRegressor
from ._sparse_linear import SparseLinearClassifier

__all__ = ["AdamOptimizer", "MLPClassifier", "MLPRegressor", "SparseLinearClassifier",
           "StockFallbackWarning", "accelerate_mlp", "check_sklearn_contract"]
