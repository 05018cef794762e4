"""Plain NumPy oracles of the low-precision formats (issue 24), written from the format
definitions (the driver's design note in fastadam/_core/_lowp.pyx), never from the driver:

- bfloat16 round to nearest even on the float32 bits, and stochastic rounding with the
  ``lowbias32`` hash keyed by (seed, t, tensor index, element index);
- the dynamic and linear quantization maps, block-wise quantize (scale = max |y|, nearest map
  value, ties to the lower code) and dequantize;
- :func:`lowp_trajectory`: an optimizer's trajectory in float64 (tests/reference.py's formulas)
  with the states and parameters stored in a low-precision format after every step.
"""
import numpy as np

M32 = 0xFFFFFFFF


# ---- bfloat16 --------------------------------------------------------------------------------
def f32_to_bf16_bits(a):
    """Round-to-nearest-even float32 -> bfloat16 bits (uint16); NaN stays a quiet NaN."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = np.isnan(np.asarray(a, np.float32))
    rounded = np.where(nan, (u >> 16) | 0x0040, rounded)
    return rounded.astype(np.uint16)


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(a):
    """float32 values rounded to the nearest bfloat16 (returned as float32)."""
    return bf16_bits_to_f32(f32_to_bf16_bits(a))


def hash32(x):
    x = np.asarray(x, np.uint64) & M32
    x ^= x >> 16
    x = (x * 0x7feb352d) & M32
    x ^= x >> 15
    x = (x * 0x846ca68b) & M32
    x ^= x >> 16
    return x


def sr_key(seed, t, tensor_index):
    lo, hi = seed & M32, (seed >> 32) & M32
    k = hash32(lo ^ 0x9E3779B9)
    k = hash32(int(k) ^ hi ^ (t & M32))
    return int(hash32(int(k) ^ (tensor_index & M32)))


def stochastic_bf16(a, seed, t, tensor_index, element_index=None):
    """float32 -> bfloat16 (as float32 values) with the spec's random bits."""
    a = np.ascontiguousarray(a, np.float32)
    j = (np.arange(a.size, dtype=np.uint64) if element_index is None
         else np.asarray(element_index, np.uint64))
    r = hash32((sr_key(seed, t, tensor_index) + j) & M32) >> 16
    u = a.reshape(-1).view(np.uint32).astype(np.uint64)
    bits = ((u + r) >> 16) & 0xFFFF
    bits = np.where(np.isnan(a.reshape(-1)), (u >> 16) | 0x0040, bits)
    return bf16_bits_to_f32(bits.astype(np.uint16)).reshape(a.shape)


# ---- 8-bit maps and block quantization -----------------------------------------------------------
def dynamic_map(signed):
    values = [0.0, 1.0]
    for i in range(7):
        edges = np.linspace(0.1, 1.0, 2 ** (i + (0 if signed else 1)) + 1)
        mids = (edges[:-1] + edges[1:]) / 2 * 10.0 ** (i - 6)
        values += list(mids) + (list(-mids) if signed else [])
    assert len(values) == 256
    return np.sort(np.array(values, np.float64)).astype(np.float32)


def linear_map(signed):
    c = np.arange(256, dtype=np.float64)
    if signed:
        values = (c - 127) / 127
        values[255] = 1.0
    else:
        values = c / 255
    return np.sort(values).astype(np.float32)


def quant_map(name, signed):
    return dynamic_map(signed) if name == "dynamic" else linear_map(signed)


def quantize(y, block, signed, name="dynamic"):
    """(codes uint8, scales float32) of float32 values y (flat), per the spec."""
    qmap = quant_map(name, signed).astype(np.float64)
    mids = (qmap[:-1] + qmap[1:]) / 2
    y = np.ascontiguousarray(y, np.float32).reshape(-1)
    nb = -(-y.size // block)
    codes = np.empty(y.size, np.uint8)
    scales = np.empty(nb, np.float32)
    zero = int(np.flatnonzero(qmap == 0.0)[0])
    for b in range(nb):
        blk = y[b * block:(b + 1) * block]
        scale = np.float32(np.max(np.abs(blk))) if blk.size else np.float32(0)
        scales[b] = scale
        if scale == 0:
            codes[b * block:(b + 1) * block] = zero
            continue
        inv = np.float32(1.0) / scale
        q = (blk * inv).astype(np.float32).astype(np.float64)
        codes[b * block:(b + 1) * block] = np.searchsorted(mids, q, side="left")
    return codes, scales


def dequantize(codes, scales, block, signed, name="dynamic"):
    qmap = quant_map(name, signed)
    codes = np.asarray(codes).reshape(-1)
    blocks = np.arange(codes.size) // block
    return (qmap[codes] * scales[blocks]).astype(np.float32)


def store(values, fmt, block=256, signed=True, name="dynamic"):
    """``values`` (float64) as the format stores them, read back as float64."""
    if fmt == "float32":
        return np.asarray(values, np.float32).astype(np.float64)
    if fmt == "bfloat16":
        return round_bf16(np.asarray(values, np.float32)).astype(np.float64)
    codes, scales = quantize(np.asarray(values, np.float32), block, signed, name)
    return dequantize(codes, scales, block, signed, name).astype(np.float64).reshape(
        np.shape(values))
