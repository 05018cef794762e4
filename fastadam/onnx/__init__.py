"""fastadam.onnx: a runtime that trains ONNX models, on fastadam's kernels and autodiff engine.

Capabilities, one module each:

- ``_training_ops``: the ``ai.onnx.preview.training`` operators Adam, Adagrad and Momentum as
  functions (``adam``, ``adagrad``, ``momentum``), functional, through the fused kernels with
  ``convention="onnx"``;
- ``_core_ops`` / ``_nn_ops`` / ``_transformer_ops``: the core ``ai.onnx`` operators (opset 7 to
  the installed onnx's newest, each in the form its opset defines) on ``fastadam.autodiff``
  Tensors, so that every one of them can be differentiated (``_transformer_ops``: what PyTorch's
  exporters write for a transformer: LayerNormalization, Gelu, Split, Slice, Trilu, ...);
- ``_graph``: compiling a node list (all static checks) and executing it, Gradient nodes included
  (the semantics are in that module's docstring: a non-scalar ``y`` is differentiated as the sum
  of its elements; Gradient of a Gradient gives higher derivatives);
- ``_model``: ``run(model, feeds)``, model loading/checking, feed checks;
- ``_session``: ``TrainingSession``, which executes ``ModelProto.training_info``
  (``initialize``, ``step``, ``run``, ``model``, ``save``, ``fit``), updating the initializers
  in place on the fused kernels;
- ``_builder``: ``make_training_model``, which adds a loss, a Gradient node, an optimizer node
  and the bindings to an inference model;
- ``_budget``: the memory budget (``set_memory_budget``, ``memory_budget``): operators that can
  make a tensor much larger than their inputs check the shape they are about to allocate and
  raise ``MemoryBudgetError`` (a ValueError) naming the node first.

``supported_operators()`` lists the operators.  Anything outside this (another domain, operator,
opset or operator form) raises
``UnsupportedOperatorError`` (a ``NotImplementedError``) naming the node, operator, domain and
opset; nothing is approximated.  Needs the ``onnx`` package (>= 1.21; the ``onnx`` extra).
"""
from ._budget import MemoryBudgetError, memory_budget, set_memory_budget
from ._builder import make_training_model
from ._graph import TRAINING_DOMAIN, UnsupportedOperatorError, supported_operators
from ._model import run
from ._session import TrainingSession
from ._training_ops import adagrad, adam, momentum

__all__ = ["MemoryBudgetError", "TRAINING_DOMAIN", "TrainingSession", "UnsupportedOperatorError",
           "adagrad", "adam", "make_training_model", "memory_budget", "momentum", "run",
           "set_memory_budget", "supported_operators"]
