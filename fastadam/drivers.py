"""fastadam.drivers: the public names of the compiled drivers, for backends and front-ends.

The drivers themselves live in the private package ``fastadam._core`` and may change shape at
any release; a front-end (``fastadam.gpu``, ``fastadam.onnx``, ``fastadam.sklearn``,
``fastadam.distributed``) reads them only through this module, ``fastadam.optim.prepare_step``
and the public functions (tests/test_layering.py enforces it).  This module imports nothing above
``fastadam._core``, so the GPU backend, which ``fastadam.optim`` dispatches to, can use it
without an import cycle.

Optimizer kinds (the ``kind`` of a coefficient object, as the C kernels number them):

- ``KIND_ADAM``, ``KIND_ADAGRAD``, ``KIND_MOMENTUM``; ``KINDS`` maps every registered
  optimizer's name to its kind (``include/fastadam/optimizers.def``);
- ``spec_of_kind(kind)``: the optimizer's registration spec (its coefficient fields, slots);
- ``dense_supported(kind, flags)``, ``sparse_supported(kind, flags)``: whether the compiled
  kernel table has that (optimizer, flag set) pair (the element kernels: False for a row-wise
  optimizer);
- ``ROWWISE_KINDS``: the kinds of the row-wise optimizers (one state value per row of the
  parameter, ``FA_ROWWISE_OPTIMIZER`` rows); ``rowwise_supported(kind, flags, sparse)``: whether
  their dense kernel (``sparse=False``) or sparse row walk takes that flag set.  They have no
  element kernel: their GPU kernels are a family of their own (``fastadam/gpu/_source.py``).

The driver registry (the second axis: device x parameter format x state format, as data;
see fastadam/_core/_drivers.py):

- ``register_device(name, claims, classify)``: a device whose arrays ``claims(array)`` tells
  apart, with ``classify(array)`` naming an array's format (``"float"``, ``"bfloat16"``,
  ``"int8"``);
- ``register_driver(device, param_format, state_format, prepare)``: the driver of one key;
  ``prepare(spec, params, slots, options)`` checks the arrays once and returns the driver bound
  to them (``run``, ``run_sparse``, ``check``, ``lists``; see ``fastadam.gpu``'s rows);
- ``driver_rows()``: every registered row;
- what a low-precision row checks its options with: ``check_block_size``, ``check_quant_map``,
  ``check_rounding``, ``check_seed``, the codes the drivers take (``FMT_F32``, ``FMT_BF16``,
  ``FMT_Q8``, ``MAP_CODES``, ``ROUND_CODES``) and ``QuantizedState``.

Arrays of the sparse steps:

- ``INDEX_TYPES``: the index dtypes the sparse kernels read (int32, int64);
- ``ROW_TYPES``: the value dtypes of the sparse kernels (float32, float64);
- ``check_rows(values, name, k, row_shape, dtype, xp=numpy)``: the gradient rows of a sparse
  step: an array of ``xp`` (NumPy or CuPy) of shape ``(k,) + row_shape`` and dtype ``dtype``
  (any of ``ROW_TYPES`` if None), C-contiguous (a copy if needed: it is only read); raises
  ``TypeError``/``ValueError`` naming ``name``.
"""
from ._core._coeffs import KIND_ADAGRAD, KIND_ADAM, KIND_MOMENTUM
from ._core._dense import dense_supported, registry as _registry_rows, rowwise_supported
from ._core._dense import sparse_supported
from ._core._drivers import register_device, register_driver
from ._core._drivers import rows as driver_rows
from ._core._lowp_state import (FMT_BF16, FMT_F32, FMT_Q8, MAP_CODES, QuantizedState,
                                check_block_size, check_quant_map)
from ._core._lowp_validation import ROUND_CODES, check_rounding, check_seed
from ._core._registry import KINDS, spec_of_kind
from ._core._validation import INDEX_TYPES, ROW_TYPES, check_rows

__all__ = ["FMT_BF16", "FMT_F32", "FMT_Q8", "INDEX_TYPES", "KINDS", "KIND_ADAGRAD", "KIND_ADAM",
           "KIND_MOMENTUM", "MAP_CODES", "QuantizedState", "ROUND_CODES", "ROWWISE_KINDS",
           "ROW_TYPES", "check_block_size", "check_quant_map", "check_rounding", "check_seed",
           "check_rows", "dense_supported", "driver_rows", "register_device", "register_driver",
           "rowwise_supported", "sparse_supported", "spec_of_kind"]

ROWWISE_KINDS = frozenset(row["kind"] for row in _registry_rows() if row["rowwise"])
