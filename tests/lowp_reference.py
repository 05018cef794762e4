"""NumPy oracles of low-precision optimizer states, written from the shared definitions of
issue 24 (never from fastadam's C code): the 8-bit maps, block-wise quantization with float64
midpoints, bfloat16 rounding (nearest even, stochastic), the stochastic-rounding hash and key,
and one optimizer step in a low-precision format: dequantize -> the float64 formula of
tests/reference.py (through tests/optimizer_table.py's rows) -> requantize.
"""
import numpy as np

# The slots that never go negative take the unsigned map (per optimizer, by functional name).
NONNEGATIVE = {"adam": {"v", "v_max"}, "adagrad": {"h"}, "momentum": set(),
               "rmsprop": {"square_avg"}, "lion": set()}

MASK32 = 0xFFFFFFFF


# ---- maps ------------------------------------------------------------------------------------

def dynamic_map(signed):
    """bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), in float64
    then rounded to float32: per i in 0..6 the means of neighbouring points of
    linspace(0.1, 1, 2**(i + s) + 1) (s = 0 signed, 1 unsigned) times 10**(i - 6), negated too
    when signed; plus 0 and 1; sorted."""
    values = [0.0, 1.0]
    s = 0 if signed else 1
    for i in range(7):
        edges = np.linspace(0.1, 1.0, 2 ** (i + s) + 1)
        means = (edges[:-1] + edges[1:]) / 2.0
        values.extend((10.0 ** (i - 6)) * means)
        if signed:
            values.extend(-(10.0 ** (i - 6)) * means)
    out = np.sort(np.asarray(values, dtype=np.float64)).astype(np.float32)
    assert out.shape == (256,)
    return out


def linear_map(signed):
    """(c - 127) / 127 for c < 255 and 1.0 at c = 255 (signed), or c / 255 (unsigned)."""
    c = np.arange(256, dtype=np.float64)
    if signed:
        out = np.where(c == 255, 1.0, (c - 127.0) / 127.0)
    else:
        out = c / 255.0
    return out.astype(np.float32)


def quant_map(qmap, signed):
    """qmap: 0 dynamic, 1 linear."""
    return dynamic_map(signed) if qmap == 0 else linear_map(signed)


def midpoints(values):
    """float64 midpoints of neighbouring map values (255 of them)."""
    v = values.astype(np.float64)
    return (v[:-1] + v[1:]) / 2.0


def codes_of(q, values):
    """The code of each float32 q: the number of midpoints strictly below q (ties: the lower
    code); a NaN q gets 0."""
    q = np.asarray(q, dtype=np.float32).astype(np.float64)
    out = np.searchsorted(midpoints(values), q, side="left")
    out[np.isnan(q)] = 0
    return out.astype(np.uint8)


def quantize(y, block, values):
    """Block-wise: scale = max |y| over the non-NaN elements (float32; an infinite maximum is
    FLT_MAX), q = y * float32(1 / scale) with a NaN's q 0, codes_of(q); a zero block gets the
    code of 0 and scale 0."""
    y = np.asarray(y, dtype=np.float32).ravel()
    nblocks = -(-y.size // block)
    codes = np.empty(y.size, np.uint8)
    scales = np.empty(nblocks, np.float32)
    for b in range(nblocks):
        part = y[b * block:(b + 1) * block]
        finite_or_inf = np.abs(part)[~np.isnan(part)]
        scale = np.float32(finite_or_inf.max()) if finite_or_inf.size else np.float32(0)
        scale = min(scale, np.finfo(np.float32).max)
        inv = np.float32(0) if scale == 0 else np.float32(1) / scale
        with np.errstate(invalid="ignore", over="ignore"):
            q = np.nan_to_num((part * inv).astype(np.float32), nan=0.0, posinf=np.inf,
                              neginf=-np.inf)
        codes[b * block:(b + 1) * block] = codes_of(q, values)
        scales[b] = scale
    return codes, scales


def dequantize(codes, scales, block, values):
    """map[code] * scale in float32."""
    codes = np.asarray(codes).ravel()
    per = np.repeat(np.asarray(scales, np.float32), block)[:codes.size]
    return (values[codes] * per).astype(np.float32)


# ---- bfloat16 -------------------------------------------------------------------------------

def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def bf16_nearest(f):
    """float32 -> bfloat16 bits, round to nearest, ties to even; NaN -> quiet NaN."""
    u = np.asarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def bf16_stochastic(f, r):
    """float32 -> bfloat16 bits: (u + r) >> 16 with 16 random bits r; NaN -> quiet NaN."""
    u = np.asarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + np.asarray(r, np.uint64)) >> 16) & 0xFFFF
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def hash32(x):
    """lowbias32 on uint32 (NumPy arrays or ints)."""
    x = np.asarray(x, dtype=np.uint64) & MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    x ^= x >> 16
    return x


def sr_key(seed, t, tensor_index):
    lo, hi = seed & MASK32, (seed >> 32) & MASK32
    k = int(hash32(lo ^ 0x9E3779B9))
    k = int(hash32(k ^ hi ^ (t & MASK32)))
    return int(hash32(k ^ (tensor_index & MASK32)))


def sr_bits(key, j):
    """The 16 random bits of elements j (flat indices) of the tensor with this key."""
    return hash32((key + np.asarray(j, dtype=np.uint64)) & MASK32) >> 16


# ---- formats of one array ---------------------------------------------------------------------

class Stored:
    """A state slot or parameter in one format: 'f32', 'bf16' (bits) or 'q8' (codes, scales)."""

    def __init__(self, fmt, values, block=None, qmap=0, signed=True):
        self.fmt, self.block, self.qmap, self.signed = fmt, block, qmap, signed
        values = np.asarray(values, np.float32)
        self.shape = values.shape
        if fmt == "f32":
            self.data = values.copy()
        elif fmt == "bf16":
            self.data = bf16_nearest(values)
        else:
            self.data, self.scales = quantize(values, block, quant_map(qmap, signed))
            self.data = self.data.reshape(self.shape)

    def value(self):
        """float32 values."""
        if self.fmt == "f32":
            return self.data.copy()
        if self.fmt == "bf16":
            return bf16_to_f32(self.data)
        return dequantize(self.data, self.scales, self.block,
                          quant_map(self.qmap, self.signed)).reshape(self.shape)

    def stored_like(self, new32):
        """The same format holding new float32 values (bf16: nearest; q8: requantized)."""
        return Stored(self.fmt, new32, self.block, self.qmap, self.signed)


def array_bytes(*objs):
    """The bytes of every array reachable from objs (dicts, lists, tuples; a QuantizedState-like
    object: its codes and scales), for the tests' "nothing changed" checks."""
    out = []
    for o in objs:
        if hasattr(o, "codes") and hasattr(o, "scales"):
            out += [o.codes.tobytes(), o.scales.tobytes()]
        elif isinstance(o, np.ndarray):
            out.append(o.tobytes())
        elif isinstance(o, dict):
            out += array_bytes(*o.values())
        elif isinstance(o, (list, tuple)):
            out += array_bytes(*o)
    return out
