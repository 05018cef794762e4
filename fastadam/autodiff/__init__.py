"""fastadam.autodiff: tape-based reverse-mode differentiation with ONNX ``Gradient`` semantics.

``gradient(y, xs, zs)`` differentiates ``y`` with respect to ``xs`` (leaves or intermediate
tensors) holding ``zs`` constant; ``create_graph=True`` makes the result differentiable again.
Primitives are NumPy/ONNX-named functions; users add their own with ``primitive`` + ``defvjp``
and check them with ``check_grads``.  See ``_engine`` for the walk, ``_tensor`` for the tape.
"""
from . import _methods  # noqa: F401  (attaches Tensor operators)
from ._check_grads import check_grads
from ._engine import backward, gradient
from ._mlp import mlp_fuses, mlp_loss_and_gradients
from ._nn import conv2d, log_softmax, mse, softmax, softmax_cross_entropy, take
from ._ops import (abs, add, broadcast_to, clip, concatenate, divide, exp, gemm, getitem, log,
                   matmul, matmul_add, max, mean, multiply, negative, power, relu, reshape,
                   sigmoid, sign, sqrt, subtract, sum, sum_to, tanh, transpose, unbroadcast,
                   where)
from ._ops_extra import (avg_pool2d, batch_norm, cast, gather, leaky_relu, max_pool2d, nll_loss,
                         pad, take_along_axis)
from ._ops_transformer import attention, attention_fuses, erf, gelu, layer_norm, maximum, minimum
from ._registry import Primitive, defvjp, defvjp_argnum, primitive, zero_vjp
from ._tensor import Tensor, is_grad_enabled, no_grad, set_grad_enabled

__all__ = [
    "Primitive", "Tensor", "abs", "add", "backward", "broadcast_to", "check_grads", "clip",
    "concatenate", "conv2d", "defvjp", "defvjp_argnum", "divide", "exp", "gemm", "getitem",
    "gradient", "is_grad_enabled", "log", "log_softmax", "matmul", "matmul_add", "max", "mean",
    "mse", "multiply", "negative", "no_grad", "power", "primitive", "relu", "reshape",
    "set_grad_enabled", "sigmoid", "sign", "softmax", "softmax_cross_entropy", "sqrt",
    "subtract", "sum", "sum_to", "take", "tanh", "transpose", "unbroadcast", "where", "zero_vjp",
    # _ops_extra (added for the ONNX front-end)
    "avg_pool2d", "batch_norm", "cast", "gather", "leaky_relu", "max_pool2d", "nll_loss", "pad",
    "take_along_axis",
    # _ops_transformer (added for transformers exported from PyTorch)
    "attention", "attention_fuses", "erf", "gelu", "layer_norm", "maximum", "minimum",
    # _mlp (an MLP's training step without a tape, for the ONNX front-end)
    "mlp_fuses", "mlp_loss_and_gradients",
]
