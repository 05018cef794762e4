"""The low-precision steps on CuPy arrays (issue 24): bfloat16 or 8-bit block-quantized state
slots, float32 or bfloat16 parameters and gradients; the arguments of the CPU driver's
``dense_step`` and ``rows_step`` (fastadam._core._lowp, through fastadam.drivers).

CuPy has no bfloat16 dtype: a bfloat16 array on the GPU is a ``uint16`` array of the bits
(``cupy.asarray(a.view(numpy.uint16))`` of an ``ml_dtypes.bfloat16`` array; a CuPy build with a
2-byte ``bfloat16`` dtype is accepted too).  8-bit states are ``uint8`` codes with one float32
scale per block of ``block`` elements, as on the CPU.

One launch per step: the table (_layout.lowp_host_table) holds the coefficient struct, the
formats and options (the maps are lowp.h's device tables) and one entry per tensor, uploaded
once.  With 8-bit states a thread block updates whole quantization blocks, about CHUNK
elements, one after another (dequantize, update, absmax by warp shuffles, requantize);
otherwise CHUNK elements.  Everything is checked before the
first launch; ``skip_nonfinite`` is one reduction into a device flag that the step reads.
"""
import cupy
import numpy as np

from .. import drivers
from . import _kernels, _layout, _source
from ._validation import check_device_array, check_disjoint, import_cupy

F32, BF16, Q8 = 0, 1, 2
FORMAT_NAMES = {F32: "float32", BF16: "bfloat16", Q8: "int8"}
_MAX_GRID = 1 << 20  # the rows kernel loops beyond this many blocks


def _is_bf16(dtype):
    return dtype.itemsize == 2 and (dtype == np.uint16 or dtype.name == "bfloat16")


MAP_NAMES = {0: "dynamic", 1: "linear"}
ROUNDING_NAMES = {0: "nearest", 1: "stochastic"}


def _check_code(value, name, names):
    """An int code among ``names`` (code -> meaning), else ValueError listing them."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or int(value) not in names:
        listed = ", ".join(f"{c} ({n})" for c, n in names.items())
        raise ValueError(f"{name}: expected one of {listed}, got {value!r}")
    return int(value)


def _check_format(value, name, allowed):
    return _check_code(value, name, {a: FORMAT_NAMES[a] for a in allowed})


def _check_typed(a, name, fmt, shape, device):
    """A device array holding format ``fmt`` (float32, bfloat16 bits, uint8 codes), of
    ``shape`` (None: any), C-contiguous."""
    check_device_array(cupy, a, name, device)
    if fmt == F32 and a.dtype != np.float32:
        raise TypeError(f"{name}: expected float32, got {a.dtype}")
    if fmt == BF16 and not _is_bf16(a.dtype):
        raise TypeError(f"{name}: expected bfloat16 (on the GPU: the bits as uint16), "
                        f"got {a.dtype}")
    if fmt == Q8 and a.dtype != np.uint8:
        raise TypeError(f"{name}: expected uint8 codes (8-bit states), got {a.dtype}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array (cupy.ascontiguousarray makes "
                         f"one), got strides {a.strides}")
    return a


def _check_list(obj, name, n):
    if not isinstance(obj, (list, tuple)):
        raise TypeError(f"{name}: expected a list of {n} arrays, got {type(obj).__name__}")
    if len(obj) != n:
        raise ValueError(f"{name}: expected {n} arrays, got {len(obj)}")
    return list(obj)


def _check_common(coeffs, state_fmt, block, qmap, signed_slots, rounding, seed, t, nslots):
    state_fmt = _check_format(state_fmt, "state_fmt", (F32, BF16, Q8))
    if state_fmt == Q8:
        if not isinstance(block, (int, np.integer)) or not 8 <= int(block) <= 4096:
            raise ValueError(f"block: expected an int in [8, 4096], got {block!r}")
    qmap = _check_code(qmap, "qmap", MAP_NAMES)
    rounding = _check_code(rounding, "rounding", ROUNDING_NAMES)
    if not isinstance(signed_slots, (tuple, list)) or len(signed_slots) != nslots:
        raise ValueError(f"signed_slots: expected {nslots} bools (one per state slot used), "
                         f"got {signed_slots!r}")
    if not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 1 << 64:
        raise ValueError(f"seed: expected an int in [0, 2**64), got {seed!r}")
    if not isinstance(t, (int, np.integer)):
        raise TypeError(f"t: expected an int, got {type(t).__name__}")
    coeffs.check_float32()  # every format computes in float32
    signed_mask = sum(1 << s for s, sg in enumerate(signed_slots) if sg)
    return state_fmt, int(block), qmap, rounding, signed_mask


def _check_scales(scales, state_fmt, nslots):
    """One list of scale arrays per slot for 8-bit states; none otherwise."""
    if state_fmt != Q8 and isinstance(scales, (list, tuple)) and scales:
        raise ValueError(f"scales: only 8-bit states (state_fmt=2) have scales, got "
                         f"{len(scales)} for state_fmt={state_fmt}")
    return _check_list(scales, "scales", nslots if state_fmt == Q8 else 0)


def _nslots(coeffs):
    return len(drivers.spec_of_kind(coeffs.kind).slot_indices(coeffs.flags))


def _scale_count(size, block):
    return -(-size // block)


def lowp_dense_step(coeffs, xs, gs, slots, scales, masters, param_fmt, grad_fmt, state_fmt,
                    block, qmap, signed_slots, rounding, seed, t, skip_nonfinite,
                    num_threads=0):
    """The CPU driver's ``dense_step`` on device arrays (``num_threads`` is ignored): returns
    False, having written nothing, when ``skip_nonfinite`` finds a non-finite gradient."""
    import_cupy("xs")
    nslots = _nslots(coeffs)
    state_fmt, block, qmap, rounding, signed_mask = _check_common(
        coeffs, state_fmt, block, qmap, signed_slots, rounding, seed, t, nslots)
    param_fmt = _check_format(param_fmt, "param_fmt", (F32, BF16))
    grad_fmt = _check_format(grad_fmt, "grad_fmt", (F32, BF16))
    if not isinstance(xs, (list, tuple)):
        raise TypeError(f"xs: expected a list of arrays, got {type(xs).__name__}")
    n = len(xs)
    gs = _check_list(gs, "gs", n)
    slots = [_check_list(lst, f"slots[{s}]", n) for s, lst in enumerate(
        _check_list(slots, "slots", nslots))]
    scales = [_check_list(lst, f"scales[{s}]", n)
              for s, lst in enumerate(_check_scales(scales, state_fmt, nslots))]
    masters = [] if masters is None or (isinstance(masters, (list, tuple)) and not masters) \
        else _check_list(masters, "masters", n)
    if masters:
        if param_fmt != BF16:
            raise ValueError("masters: float32 master copies go with bfloat16 parameters "
                             "(param_fmt=1)")
    device = None
    for i, x in enumerate(xs):
        _check_typed(x, f"xs[{i}]", param_fmt, None, device)
        device = x.device.id if device is None else device
        _check_typed(gs[i], f"gs[{i}]", grad_fmt, x.shape, device)
        for s in range(nslots):
            _check_typed(slots[s][i], f"slots[{s}][{i}]", state_fmt, x.shape, device)
            if state_fmt == Q8:
                _check_typed(scales[s][i], f"scales[{s}][{i}]", F32,
                             (_scale_count(x.size, block),), device)
        if masters:
            _check_typed(masters[i], f"masters[{i}]", F32, x.shape, device)
    flags = coeffs.flags
    if flags not in _source.DENSE_FLAGS[coeffs.kind]:
        raise ValueError(f"the GPU low-precision step has no kernel for optimizer kind "
                         f"{coeffs.kind} with flags {flags}")
    written = [("xs", xs, True)] + [(f"slots[{s}]", lst, True) for s, lst in enumerate(slots)]
    written += [(f"scales[{s}]", lst, True) for s, lst in enumerate(scales)]
    if masters:
        written.append(("masters", masters, True))
    check_disjoint(written + [("gs", gs, False)])
    if not n or not any(x.size for x in xs):
        return True

    span = _layout.lowp_span(state_fmt == Q8, block)
    header = _layout.lowp_header(coeffs, dict(
        param_fmt=param_fmt, grad_fmt=grad_fmt, rounding=rounding, has_master=int(bool(masters)),
        signed_mask=signed_mask, block=block, span=span, qmap=qmap, seed_lo=seed,
        seed_hi=int(seed) >> 32, t=t))
    pointers = {"x": [a.data.ptr for a in xs], "g": [a.data.ptr for a in gs]}
    for s in range(nslots):
        pointers[f"s{s}"] = [a.data.ptr for a in slots[s]]
        if state_fmt == Q8:
            pointers[f"scale{s}"] = [a.data.ptr for a in scales[s]]
    if masters:
        pointers["master"] = [a.data.ptr for a in masters]
    host, count, nblocks = _layout.lowp_host_table(header, [x.size for x in xs], pointers, span)
    state = _source_state(state_fmt)
    threads = _layout.lowp_threads(state_fmt == Q8, block)
    with cupy.cuda.Device(device):
        table = _kernels.upload_table(host)
        step = _kernels.function("lowp", state, coeffs.kind,
                                 _source.lowp_dense_name(state, coeffs.kind, flags))
        if not skip_nonfinite:
            step((nblocks,), (threads,), (table, np.int32(count), table, np.int32(0)))
            return True
        flag = cupy.zeros(1, dtype=np.int32)
        check = _kernels.function("lowp", state, coeffs.kind, _source.lowp_nonfinite_name(
            FORMAT_NAMES[grad_fmt]))
        check((nblocks,), (threads,),
              (table, np.int32(count), np.float64(coeffs.grad_scale), flag))
        step((nblocks,), (threads,), (table, np.int32(count), flag, np.int32(1)))
        return not bool(flag.get()[0])


def _source_state(state_fmt):
    return FORMAT_NAMES[state_fmt]


def lowp_rows_step(coeffs, x, rows, values, slots, scales, master, param_fmt, state_fmt, block,
                   qmap, signed_slots, rounding, seed, t, num_threads=0):
    """The CPU driver's ``rows_step`` (the lazy sparse step) on device arrays: rows ``rows``
    (int64, sorted, distinct) of the (R, D) table ``x`` take the coalesced float32 gradient
    rows ``values``; only those rows change.  ``num_threads`` is ignored."""
    import_cupy("x")
    nslots = _nslots(coeffs)
    state_fmt, block, qmap, rounding, signed_mask = _check_common(
        coeffs, state_fmt, block, qmap, signed_slots, rounding, seed, t, nslots)
    param_fmt = _check_format(param_fmt, "param_fmt", (F32, BF16))
    _check_typed(x, "x", param_fmt, None, None)
    device = x.device.id
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D table (rows, row size), got shape {x.shape}")
    n_rows, row_size = x.shape
    if state_fmt == Q8 and row_size % block:
        raise ValueError(f"block_size: {block} does not divide the row size D={row_size}; a "
                         f"sparse row must be whole blocks (pick a divisor of {row_size})")
    check_device_array(cupy, rows, "rows", device)
    if rows.dtype != np.int64 or rows.ndim != 1:
        raise TypeError(f"rows: expected a 1-D int64 array, got {rows.dtype} of shape "
                        f"{rows.shape}")
    k = rows.shape[0]
    _check_typed(values, "values", F32, (k, row_size), device)
    slots = _check_list(slots, "slots", nslots)
    for s, a in enumerate(slots):
        _check_typed(a, f"slots[{s}]", state_fmt, x.shape, device)
    scales = _check_scales(scales, state_fmt, nslots)
    for s, a in enumerate(scales):
        _check_typed(a, f"scales[{s}]", F32, (_scale_count(x.size, block),), device)
    if master is not None:
        if param_fmt != BF16:
            raise ValueError("master: a float32 master copy goes with bfloat16 parameters "
                             "(param_fmt=1)")
        _check_typed(master, "master", F32, x.shape, device)
    flags = coeffs.flags
    if flags not in _source.SPARSE_FLAGS[coeffs.kind]:
        raise ValueError(f"the GPU low-precision rows step has no kernel for optimizer kind "
                         f"{coeffs.kind} with flags {flags}")
    written = [("x", [x], True)] + [(f"slots[{s}]", [a], True) for s, a in enumerate(slots)]
    written += [(f"scales[{s}]", [a], True) for s, a in enumerate(scales)]
    if master is not None:
        written.append(("master", [master], True))
    check_disjoint(written + [("values", [values], False), ("rows", [rows], False)], True)
    with cupy.cuda.Device(device):
        if k:
            bad = cupy.stack([(rows < 0).any(), (rows >= n_rows).any(),
                              (rows[1:] <= rows[:-1]).any()]).get()
            if bad[0] or bad[1]:
                raise IndexError(f"rows: an index is out of range for {n_rows} rows")
            if bad[2]:
                raise ValueError("rows: expected sorted distinct row indices (coalesce the "
                                 "gradient first)")
        if not k or not row_size:
            return None
        header = _layout.lowp_header(coeffs, dict(
            param_fmt=param_fmt, grad_fmt=F32, rounding=rounding,
            has_master=int(master is not None), signed_mask=signed_mask, block=block,
            span=block if state_fmt == Q8 else row_size, qmap=qmap, seed_lo=seed,
            seed_hi=int(seed) >> 32, t=t))
        pointers = {"x": [x.data.ptr], "g": [values.data.ptr]}
        for s in range(nslots):
            pointers[f"s{s}"] = [slots[s].data.ptr]
            if state_fmt == Q8:
                pointers[f"scale{s}"] = [scales[s].data.ptr]
        if master is not None:
            pointers["master"] = [master.data.ptr]
        host, _, _ = _layout.lowp_host_table(header, [x.size], pointers, x.size)
        table = _kernels.upload_table(host)
        parts = row_size // block if state_fmt == Q8 else 1
        state = _source_state(state_fmt)
        step = _kernels.function("lowp", state, coeffs.kind,
                                 _source.lowp_rows_name(state, coeffs.kind, flags))
        threads = _layout.lowp_threads(state_fmt == Q8, block, row_size)
        # a thread block copies the maps once and loops over about CHUNK elements of rows
        per_block = _layout.lowp_span(state_fmt == Q8, block) // block if state_fmt == Q8 else 1
        grid = min(-(-(k * parts) // per_block), _MAX_GRID)
        step((grid,), (threads,),
             (table, rows, np.int64(k), np.int64(row_size)))
        return None


# ------------------------------------------------------------------------------------------
# The public dense steps on low-precision device arrays.  fastadam.step_inplace and the other
# functional steps, and prepare_step, hand CuPy arrays to fastadam.gpu.dense_step; when one of
# them is a low-precision array (bfloat16 bits: uint16; an 8-bit slot: an object with codes,
# scales, block_size, quant_map and signed, as fastadam.optim.QuantizedState), the step runs
# here, rounding parameters to nearest (no master, no stochastic rounding: those options are
# the low-precision driver's).

_QUANT_MAPS = {"dynamic": 0, "linear": 1}


def _is_quantized(obj):
    return all(hasattr(obj, f) for f in ("codes", "scales", "block_size", "quant_map", "signed"))


def _first(obj):
    return obj[0] if isinstance(obj, (list, tuple)) and obj else obj


def is_lowp_call(x, g, slots):
    """True when the first array of x, g or a slot is bfloat16 bits or an 8-bit slot."""
    nd = cupy.ndarray
    for obj in [x, g] + [a for _, a in slots]:
        a = _first(obj)
        if type(a) is nd:  # the common case: one dtype check (hasattr probes are slow)
            if a.dtype.itemsize == 2 and _is_bf16(a.dtype):
                return True
        elif _is_quantized(a) or (isinstance(a, nd) and _is_bf16(a.dtype)):
            return True
    return False


def _as_list(obj):
    if isinstance(obj, (list, tuple)):
        return list(obj), False
    return [obj], True


def _array_format(a, name):
    check_device_array(cupy, a, name, None)  # a NumPy array here: the mix error
    if isinstance(a, cupy.ndarray):
        if a.dtype == np.float32:
            return F32
        if _is_bf16(a.dtype):
            return BF16
    raise TypeError(f"{name}: a low-precision step takes float32 or bfloat16 (uint16 bits) "
                    f"cupy arrays, got {getattr(a, 'dtype', type(a).__name__)}")


def dense_step_public(coeffs, x, g, slots, skip_nonfinite):
    """The functional steps' dense step (``fastadam.gpu.dense_step``) when is_lowp_call: the
    formats are read from the arrays (one format per argument), then lowp_dense_step."""
    xs, single = _as_list(x)
    gs, _ = _as_list(g)
    name = (lambda base, i: base if single else f"{base}[{i}]")
    param_fmt = _array_format(xs[0], name("x", 0)) if xs else F32
    grad_fmt = _array_format(gs[0], name("g", 0)) if gs else F32
    slot_lists = [(n, _as_list(obj)[0]) for n, obj in slots]
    state_fmt, codes, scales, block, qmap, signed = _slot_formats(slot_lists, name)
    return lowp_dense_step(coeffs, xs, gs, codes, scales, [], param_fmt, grad_fmt, state_fmt,
                           block, qmap, signed, 0, 0, 0, skip_nonfinite)


def _slot_formats(slot_lists, name):
    """(state_fmt, codes lists, scales lists, block, qmap, signed) of the public steps' slots
    (name, [arrays or 8-bit slots]): one format for all."""
    state_fmt, block, qmap = None, 256, 0
    for n, lst in slot_lists:
        if not lst:
            continue
        fmt = Q8 if _is_quantized(lst[0]) else _array_format(lst[0], name(n, 0))
        if state_fmt is not None and fmt != state_fmt:
            raise TypeError(f"{n}: every state of a low-precision step has one format, got "
                            f"{FORMAT_NAMES[fmt]} beside {FORMAT_NAMES[state_fmt]}")
        state_fmt = fmt
    state_fmt = F32 if state_fmt is None else state_fmt
    codes, scales, signed = [], [], []
    for n, lst in slot_lists:
        if state_fmt != Q8:
            codes.append(lst)
            signed.append(True)
            continue
        for i, q in enumerate(lst):
            if not _is_quantized(q):
                raise TypeError(f"{name(n, i)}: expected an 8-bit state (QuantizedState) like "
                                f"the other states, got {type(q).__name__}")
        first = lst[0]
        block, qmap = int(first.block_size), _QUANT_MAPS.get(first.quant_map)
        if qmap is None:
            raise ValueError(f"{name(n, 0)}: quant_map {first.quant_map!r} is not one of "
                             f"{tuple(_QUANT_MAPS)}")
        for i, q in enumerate(lst):
            if int(q.block_size) != block or q.quant_map != first.quant_map:
                raise ValueError(f"{name(n, i)}: block_size {q.block_size} and quant_map "
                                 f"{q.quant_map!r} differ from {name(n, 0)}'s ({block}, "
                                 f"{first.quant_map!r})")
        codes.append([q.codes for q in lst])
        scales.append([q.scales for q in lst])
        signed.append(bool(first.signed))
    return state_fmt, codes, scales, block, qmap, tuple(signed)
