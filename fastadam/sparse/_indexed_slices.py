"""``IndexedSlices``: a sparse gradient made of rows of a dense tensor (TensorFlow's meaning).

``values[k]`` is a contribution to row ``indices[k]`` of a tensor of shape ``dense_shape``;
indices may repeat (contributions add up) and need not be sorted.  Produced by
``fastadam.autodiff.take``'s gradient, consumed by ``fastadam.sparse_step_inplace``.
"""
import numpy as np


def _on_device(a):
    """A CuPy (or other CUDA) array: kept as it is, for fastadam.gpu.  (Told apart as
    fastadam.gpu.is_device_array does, by type and array protocol, so that this data type
    imports no backend.)"""
    if type(a) is np.ndarray:
        return False
    return type(a).__module__.split(".")[0] == "cupy" or hasattr(a, "__cuda_array_interface__")


class IndexedSlices:
    """Rows ``values`` at ``indices`` of a tensor of shape ``dense_shape``.

    Parameters
    ----------
    values : ndarray, shape ``(len(indices),) + dense_shape[1:]``
    indices : 1-D integer ndarray (int32 or int64), values in ``[0, dense_shape[0])``
    dense_shape : tuple of int
    """

    __slots__ = ("values", "indices", "dense_shape")

    def __init__(self, values, indices, dense_shape):
        if not (_on_device(values) and _on_device(indices)):  # CuPy arrays stay
            values = np.asarray(values)
            indices = np.asarray(indices)
        dense_shape = tuple(int(d) for d in dense_shape)
        if indices.ndim != 1:
            raise ValueError(f"indices: expected a 1-D array, got shape {indices.shape}")
        if indices.dtype.kind not in "iu":
            raise TypeError(f"indices: expected an integer array, got {indices.dtype}")
        if len(dense_shape) < 1:
            raise ValueError("dense_shape: expected at least one dimension")
        expected = (indices.shape[0],) + dense_shape[1:]
        if values.shape != expected:
            raise ValueError(f"values: expected shape {expected} for {indices.shape[0]} indices "
                             f"of a tensor of shape {dense_shape}, got {values.shape}")
        self.values = values
        self.indices = indices
        self.dense_shape = dense_shape

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def shape(self):
        return self.dense_shape

    def to_dense(self):
        """The dense tensor: a zero array with every row added at its index (np.add.at)."""
        out = np.zeros(self.dense_shape, dtype=self.values.dtype)
        if self.indices.size:
            if self.indices.min() < 0 or self.indices.max() >= self.dense_shape[0]:
                raise IndexError(f"indices: out of range for dense_shape {self.dense_shape}")
            np.add.at(out, self.indices, self.values)
        return out

    def __repr__(self):
        return (f"IndexedSlices(values={self.values.dtype}{list(self.values.shape)}, "
                f"indices={self.indices.dtype}[{self.indices.shape[0]}], "
                f"dense_shape={self.dense_shape})")
