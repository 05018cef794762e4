"""State dicts and checkpoint files of the optimizer objects: a fixed schema, checked in full.

Design.  ``state_dict()`` is plain data: JSON-compatible metadata (format tag, optimizer name,
``t``, options, groups with their hyper-parameters; built-in schedules as name and arguments)
plus one list of arrays per state slot.  ``load_state_dict`` and ``load`` share one checker that
accepts exactly that schema -- an unknown or missing key, a wrong type (the string ``"false"``
for a flag, a float ``t``), another group layout or parameter count raises TypeError/ValueError
naming the key -- and only then writes, so a failed load changes nothing.

Low-precision states (issue 24) add the key ``state_format`` (state_dtype, block_size,
quant_map, param_rounding, master_weights, seed), which must equal the optimizer's; their
arrays are stored as they live: bfloat16 slots as they are (in files as their uint16 bits),
8-bit slots as ``{slot}`` (uint8 codes) and ``{slot}_scales`` (float32), float32 masters of
bfloat16 parameters as ``master`` (one per bfloat16 parameter, in parameter order).  A state
of another format, block size or length is refused before anything is written.
``state_format`` also records ``min_8bit_size`` and ``param_states``, each parameter's state
format: with ``state_dtype="int8"`` a parameter below ``min_8bit_size`` keeps float32 states,
stored as they are under ``{slot}``, with an empty ``{slot}_scales``.  The per-parameter
formats must equal the loading optimizer's (they decide the arrays; its ``min_8bit_size`` may
differ as long as they agree).  A state written before ``min_8bit_size`` existed has neither
key, and every parameter's states in ``state_dtype``: what those versions kept.  The values of
a low-precision state are checked too, before anything is written: 8-bit scales finite and
>= 0, bfloat16 and float32 states and masters finite, the non-negative slots (Adam's
``exp_avg_sq``, ...) >= 0 (one NaN scale would make its whole block of parameters NaN at the
next step).

File format: a zip (stored, as ``np.savez`` writes) of ``.npy`` entries: ``meta.npy`` (the
metadata as UTF-8 JSON in a uint8 array), ``param_{i}.npy`` and ``{slot}_{i}.npy``.  ``save``
writes through :func:`fastadam.io.atomic_write` (a temporary file beside the target, flushed
and fsynced, then ``os.replace``d over it), so a crash or a full disk leaves the previous
checkpoint whole.  ``load`` never unpickles; it reads every entry's ``.npy`` header (dtype,
shape, order) and checks it, and the entry's size, against what this optimizer expects before
reading any array data, so a small file cannot make it allocate more than its own parameters
and state.  The metadata goes through the constructor's checks, those that depend on the
parameters' dtypes included (``Optimizer.check_precision``).
"""
from __future__ import annotations

import json
import numbers
import os
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from numpy.lib import format as npy_format

from .._core._lowp_state import QuantizedState, check_scales, is_bfloat16
from .._core._registry import spec as registry_spec
from ..io import atomic_write
from . import schedules
from ._checks import check_bool, check_clip
from ._lowp_objects import check_min_8bit_size, param_state_formats
from .schedules import Schedule

FORMAT = "fastadam.optim/1"
USER_SCHEDULE = {"schedule": "user"}  # stands for a callable learning rate (not serialised)
MAX_META_BYTES = 1 << 20
META_KEYS = ("format", "optimizer", "t", "options", "param_groups")


# ---- state dicts -----------------------------------------------------------------------------
def entry_lists(opt) -> Dict[str, List[np.ndarray]]:
    """The arrays the state is stored in, by state-dict key (each list in parameter order)."""
    if opt._lowp is None:
        return dict(opt._slots)
    out: Dict[str, List[np.ndarray]] = {}
    for name, arrays in opt._slots.items():
        if opt._lowp.state_dtype == "int8":  # float32 states (min_8bit_size): no scales
            out[name] = [q.codes if isinstance(q, QuantizedState) else q for q in arrays]
            out[f"{name}_scales"] = [q.scales if isinstance(q, QuantizedState)
                                     else np.zeros(0, np.float32) for q in arrays]
        else:
            out[name] = list(arrays)
    if opt._lowp.master_weights:
        out["master"] = [m for m in opt._master_list if m is not None]
    return out


def _raw(a: np.ndarray) -> np.ndarray:
    """A bfloat16 array as its uint16 bits (what .npy files hold); others as they are."""
    return a.view(np.uint16) if is_bfloat16(a.dtype) else a


def _encode_lr(lr: Any) -> Any:
    if isinstance(lr, Schedule):
        return lr.to_dict()
    if callable(lr):
        return dict(USER_SCHEDULE)
    return lr


def metadata(opt) -> Dict[str, Any]:
    groups = []
    for hyper, idx in zip(opt._groups, opt._group_params):
        group: Dict[str, Any] = {"params": list(idx)}
        for key, value in hyper.items():
            value = _encode_lr(value) if key == "lr" else value
            group[key] = list(value) if isinstance(value, tuple) else value
        groups.append(group)
    meta = {"format": FORMAT, "optimizer": type(opt).__name__, "t": opt.t,
            "options": {"clip_grad_norm": opt._clip, **opt._options}, "param_groups": groups}
    if opt._lowp is not None:
        meta["state_format"] = {**opt._lowp.as_dict(), "min_8bit_size": opt._lowp.min_8bit_size,
                                "param_states": param_state_formats(opt)}
    return meta


def state_dict(opt) -> Dict[str, Any]:
    state = metadata(opt)
    for name, arrays in entry_lists(opt).items():
        state[name] = [a.copy() for a in arrays]
    return state


def _check_state_format(opt, state: Dict[str, Any], where: str) -> Tuple[str, ...]:
    """The format of a low-precision state equals the optimizer's; returns the extra key."""
    have = "state_format" in state if isinstance(state, dict) else False
    if opt._lowp is None:
        if have:
            got = state["state_format"]
            sd = got.get("state_dtype") if isinstance(got, dict) else got
            raise ValueError(f"{where}['state_format']: the state holds {sd!r} optimizer "
                             f"states; this optimizer keeps float32 states (build it with "
                             f"the same state_dtype, block_size, quant_map)")
        return ()
    if not have:
        if isinstance(state, dict):
            raise ValueError(f"{where}: the state has no 'state_format' (an optimizer with "
                             f"float32 states and parameters); this optimizer has "
                             f"{opt._lowp.as_dict()}")
        return ()
    got = state["state_format"]
    fwhere = f"{where}['state_format']"
    expected = opt._lowp.as_dict()
    if not isinstance(got, dict):
        raise TypeError(f"{fwhere}: expected a dict, got {type(got).__name__}")
    per_param = [k for k in PER_PARAM_KEYS if k in got]
    if per_param and len(per_param) != len(PER_PARAM_KEYS):
        raise ValueError(f"{fwhere}: {list(PER_PARAM_KEYS)} come together (a state written "
                         f"before min_8bit_size has neither); got only {per_param[0]!r}")
    _check_keys({k: v for k, v in got.items() if k not in PER_PARAM_KEYS}, tuple(expected),
                fwhere)
    for key, value in expected.items():
        if type(got[key]) is not type(value) or got[key] != value:
            raise ValueError(f"{fwhere}['{key}']: the state was saved with "
                             f"{key}={got[key]!r}, this optimizer has {key}={value!r}")
    _check_param_states(opt, got, fwhere)
    return ("state_format",)


PER_PARAM_KEYS = ("min_8bit_size", "param_states")


def _check_param_states(opt, got: Dict[str, Any], where: str) -> None:
    """Each parameter's saved state format equals this optimizer's (``param_states``; absent:
    written before min_8bit_size, every parameter in ``state_dtype``)."""
    ours = param_state_formats(opt)
    dtype = opt._lowp.state_dtype
    if "param_states" not in got:
        saved, saved_min = [dtype] * len(ours), None
    else:
        saved_min = check_min_8bit_size(got["min_8bit_size"], f"{where}['min_8bit_size']")
        saved = got["param_states"]
        if not isinstance(saved, (list, tuple)) or len(saved) != len(ours):
            n = len(saved) if isinstance(saved, (list, tuple)) else type(saved).__name__
            raise ValueError(f"{where}['param_states']: expected {len(ours)} state formats "
                             f"(one per parameter), got {n}")
        allowed = ("float32", dtype)
        for i, f in enumerate(saved):
            if not isinstance(f, str) or f not in allowed:
                raise ValueError(f"{where}['param_states'][{i}]: expected one of "
                                 f"{sorted(set(allowed))} for state_dtype={dtype!r}, got {f!r}")
    for i, (f, g) in enumerate(zip(saved, ours)):
        if f != g:
            when = ("before min_8bit_size existed (every parameter's states in state_dtype)"
                    if saved_min is None else f"with min_8bit_size={saved_min}")
            raise ValueError(
                f"{where}['param_states'][{i}]: the state was saved {when} and holds "
                f"{f} states for {opt._labels[i]} ({opt._arrays[i].size} elements); this "
                f"optimizer (min_8bit_size={opt._lowp.min_8bit_size}) keeps {g} states for it: "
                f"build it with the min_8bit_size the state was saved with"
                + (" (0)" if saved_min is None else ""))


def _check_keys(obj: Any, expected: Tuple[str, ...], where: str) -> None:
    if not isinstance(obj, dict):
        raise TypeError(f"{where}: expected a dict, got {type(obj).__name__}")
    unknown = sorted(str(k) for k in obj if k not in expected)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (expected {list(expected)})")
    missing = [k for k in expected if k not in obj]
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r}")


def _decode_lr(value: Any, current: Any, where: str) -> Any:
    if not isinstance(value, dict):
        return value
    if value == USER_SCHEDULE:
        if callable(current) and not isinstance(current, Schedule):
            return current
        raise ValueError(f"{where}: the state was saved with a user-defined learning-rate "
                         f"callable, which is not serialised; build the optimizer with that "
                         f"callable as lr before loading")
    try:
        return schedules.from_dict(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def check_metadata(opt, state: Dict[str, Any], where: str,
                   extra_keys: Tuple[str, ...] = ()) -> Tuple[int, Optional[float], List[Dict]]:
    """Validate everything but the arrays; returns (t, clip_grad_norm, groups)."""
    extra_keys = extra_keys + _check_state_format(opt, state, where)
    _check_keys(state, META_KEYS + extra_keys, where)
    if state["format"] != FORMAT:
        raise ValueError(f"{where}['format']: expected {FORMAT!r}, got {state['format']!r}")
    name = type(opt).__name__
    if state["optimizer"] != name:
        raise ValueError(f"{where}['optimizer']: this state belongs to "
                         f"{state['optimizer']!r}, not to {name!r}")
    t = state["t"]
    if isinstance(t, np.ndarray) and t.shape == ():
        t = t.item()
    if (isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral)
            or not 0 <= t < 2 ** 63):
        raise ValueError(f"{where}['t']: expected an int step count in [0, 2**63), got {t!r}")
    options = state["options"]
    _check_keys(options, ("clip_grad_norm",) + opt.structural_options, f"{where}['options']")
    try:
        clip = check_clip(options["clip_grad_norm"])
        for key in opt.structural_options:
            if check_bool(options[key], key) != opt._options[key]:
                raise ValueError(f"{key}: the state has {key}={options[key]}, this optimizer "
                                 f"{opt._options[key]} (it decides the state slots)")
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}['options']: {exc}") from None
    groups = state["param_groups"]
    if not isinstance(groups, (list, tuple)) or len(groups) != len(opt._groups):
        got = len(groups) if isinstance(groups, (list, tuple)) else type(groups).__name__
        raise ValueError(f"{where}['param_groups']: expected {len(opt._groups)} groups, "
                         f"got {got}")
    checked = []
    for gi, group in enumerate(groups):
        gwhere = f"{where}['param_groups'][{gi}]"
        _check_keys(group, ("params",) + opt.group_keys, gwhere)
        indices = group["params"]
        if not isinstance(indices, (list, tuple)) or list(indices) != opt._group_params[gi]:
            raise ValueError(f"{gwhere}['params']: expected the parameter indices "
                             f"{opt._group_params[gi]} of this optimizer's group {gi}, got "
                             f"{group['params']!r}")
        hyper = {k: group[k] for k in opt.group_keys}
        hyper["lr"] = _decode_lr(hyper["lr"], opt._groups[gi]["lr"], f"{gwhere}['lr']")
        try:
            hyper = opt.check_group(hyper)
            opt.check_precision(hyper, [opt._arrays[i] for i in opt._group_params[gi]])
            checked.append(hyper)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{gwhere}: {exc}") from None
    return int(t), clip, checked


def _check_arrays(arrays: Any, expected: List[np.ndarray], where: str) -> List[np.ndarray]:
    if not isinstance(arrays, (list, tuple)) or len(arrays) != len(expected):
        got = len(arrays) if isinstance(arrays, (list, tuple)) else type(arrays).__name__
        raise ValueError(f"{where}: expected {len(expected)} arrays (one per parameter), "
                         f"got {got}")
    for i, (a, b) in enumerate(zip(arrays, expected)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{where}[{i}]: expected a numpy.ndarray, got {type(a).__name__}")
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"{where}[{i}]: expected {b.dtype} of shape {b.shape}, got "
                             f"{a.dtype} of shape {a.shape}")
    return list(arrays)


def _check_values(opt, slots: Dict[str, List[np.ndarray]], where) -> None:
    """A low-precision optimizer's state values (see the top): ValueError naming the entry
    (``where(name, i)``) otherwise.  Codes take every uint8 value; a float optimizer's
    states are not read."""
    if opt._lowp is None:
        return
    spec = registry_spec(opt.spec_name) if opt.spec_name else None
    nonnegative = set() if spec is None else {
        obj for obj, fn in zip(spec.object_slots, spec.slots) if fn in spec.nonnegative_slots}
    for name, arrays in slots.items():
        for i, a in enumerate(arrays):
            if name.endswith("_scales") and name[:-len("_scales")] in opt._slots:
                check_scales(a, where(name, i))
                continue
            if a.dtype == np.uint8:  # 8-bit codes
                continue
            if a.dtype == np.uint16 or is_bfloat16(a.dtype):  # bfloat16 (in a file: its bits)
                values = (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                values = a
            bad = ~np.isfinite(values)
            if name in nonnegative:
                bad |= values < 0
            if bad.any():
                k = int(np.flatnonzero(bad.reshape(-1))[0])
                need = "finite and >= 0" if name in nonnegative else "finite"
                raise ValueError(f"{where(name, i)}: expected {need} values, got "
                                 f"{values.reshape(-1)[k]} at flat index {k} (a corrupted "
                                 f"state would make the parameters NaN)")


def _commit(opt, t, clip, groups, slots: Dict[str, List[np.ndarray]],
            params: Optional[List[np.ndarray]] = None) -> None:
    """Write a fully checked state (no check may fail past this point)."""
    targets = entry_lists(opt)
    for name, arrays in slots.items():
        for src, dst in zip(arrays, targets[name]):
            np.copyto(_raw(dst), _raw(src))
    if params is not None:
        for src, dst in zip(params, opt._arrays):
            np.copyto(_raw(dst), _raw(src))
    opt._groups = groups
    opt._clip = clip
    opt.t = t


def load_state_dict(opt, state: Dict[str, Any]) -> None:
    entries = entry_lists(opt)
    t, clip, groups = check_metadata(opt, state, "state", tuple(entries))
    slots = {name: _check_arrays(state[name], entries[name], f"state[{name!r}]")
             for name in entries}
    _check_values(opt, slots, lambda name, i: f"state[{name!r}][{i}]")
    _commit(opt, t, clip, groups, slots)


# ---- files -------------------------------------------------------------------------------------
def _entries(opt) -> List[Tuple[str, np.ndarray]]:
    names = [(f"param_{i}", _raw(a)) for i, a in enumerate(opt._arrays)]
    for slot, arrays in entry_lists(opt).items():
        names += [(f"{slot}_{i}", _raw(a)) for i, a in enumerate(arrays)]
    return names


def save(opt, path: Any) -> None:
    meta = json.dumps(metadata(opt), allow_nan=False).encode("utf-8")
    with atomic_write(path) as f:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, array in [("meta", np.frombuffer(meta, np.uint8))] + _entries(opt):
                with zf.open(name + ".npy", "w", force_zip64=True) as out:
                    npy_format.write_array(out, array, allow_pickle=False)


def _read_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str):
    """(shape, dtype, data offset) of one .npy entry, from its header only."""
    with zf.open(info) as f:
        try:
            version = npy_format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npy_format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = npy_format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version}")
        except (ValueError, EOFError, SyntaxError) as exc:
            raise ValueError(f"{where}: not a valid .npy entry ({exc})") from None
        offset = f.tell()
    if fortran:
        raise ValueError(f"{where}: expected a C-order array, got Fortran order")
    return shape, dtype, offset


def _read_entry(zf, info, where, shape, dtype, check_shape=True) -> np.ndarray:
    got_shape, got_dtype, offset = _read_header(zf, info, where)
    if got_dtype != dtype or (check_shape and got_shape != shape) or (
            not check_shape and (len(got_shape) != 1 or got_shape[0] > MAX_META_BYTES)):
        raise ValueError(f"{where}: expected {np.dtype(dtype)} of shape {shape}, got "
                         f"{got_dtype} of shape {got_shape}")
    nbytes = int(np.prod(got_shape, dtype=object)) * np.dtype(dtype).itemsize
    if info.file_size != offset + nbytes:
        raise ValueError(f"{where}: the entry holds {info.file_size - offset} bytes of data, "
                         f"its header says {nbytes}")
    with zf.open(info) as f:
        f.read(offset)
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise ValueError(f"{where}: truncated ({len(data)} of {nbytes} bytes)")
    return np.frombuffer(data, dtype=dtype).reshape(got_shape)


def _read_checkpoint(opt, zf: zipfile.ZipFile, not_ours: str, params: bool):
    """Check and read every entry: the metadata, then every array header, then the data."""
    infos = zf.infolist()
    by_name = {info.filename: info for info in infos}
    if "meta.npy" not in by_name:
        raise ValueError(f"{not_ours} (no meta.npy entry)")
    if len(by_name) != len(infos):
        raise ValueError(f"{not_ours} (an entry name appears twice)")
    meta_bytes = _read_entry(zf, by_name["meta.npy"], "meta.npy", ("n",), np.uint8,
                             check_shape=False)
    try:
        meta = json.loads(meta_bytes.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{not_ours} (meta.npy is not JSON: {exc})") from None
    t, clip, groups = check_metadata(opt, meta, "meta")
    expected = dict(_entries(opt))
    unknown = sorted(set(by_name) - {f"{k}.npy" for k in expected} - {"meta.npy"})
    if unknown:
        raise ValueError(f"path: unknown entry {unknown[0]!r} (this optimizer has "
                         f"{len(opt._arrays)} parameters and slots "
                         f"{list(entry_lists(opt))})")
    missing = [k for k in expected if f"{k}.npy" not in by_name]
    if missing:
        raise ValueError(f"path: missing entry '{missing[0]}.npy'")
    for key, array in expected.items():  # every header before any data
        shape, dtype, _ = _read_header(zf, by_name[f"{key}.npy"], f"{key}.npy")
        if dtype != array.dtype or shape != array.shape:
            raise ValueError(f"{key}.npy: expected {array.dtype} of shape {array.shape}, "
                             f"got {dtype} of shape {shape}")
    read = {key: _read_entry(zf, by_name[f"{key}.npy"], f"{key}.npy", array.shape, array.dtype)
            for key, array in expected.items() if params or not key.startswith("param_")}
    return t, clip, groups, read


def load(opt, path: Any, *, params: bool = True) -> None:
    params = check_bool(params, "params")
    name = os.fspath(path)
    not_ours = f"path: {name!r} is not a fastadam.{type(opt).__name__} checkpoint"
    try:
        zf = zipfile.ZipFile(name)
    except zipfile.BadZipFile:
        raise ValueError(f"{not_ours} (not a zip file)") from None
    with zf:
        try:
            t, clip, groups, read = _read_checkpoint(opt, zf, not_ours, params)
        except zipfile.BadZipFile as exc:  # a CRC mismatch: corrupted data
            raise ValueError(f"path: corrupted entry ({exc})") from None
    n = len(opt._arrays)
    slots = {slot: [read[f"{slot}_{i}"] for i in range(len(arrays))]
             for slot, arrays in entry_lists(opt).items()}
    saved_params = [read[f"param_{i}"] for i in range(n)] if params else None
    _check_values(opt, slots, lambda name, i: f"{name}_{i}.npy")
    _commit(opt, t, clip, groups, slots, saved_params)
