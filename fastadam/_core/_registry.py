"""The Python side of the optimizer registration list (include/fastadam/optimizers.def).

One :class:`OptimizerSpec` per optimizer says what every Python table needs to know of it: the
fields of its C coefficient struct (in the header's order; ``flags`` is always last), its state
slots (names in the functional steps and in the optimizer objects, in kernel slot order), the
option behind each flag bit, its fold (hyper-parameters and step number -> coefficient object),
and its names in ONNX and torch.  The C list decides the kinds and which flag sets each path
has; :func:`register` joins a spec to its C row by name and checks that the struct's size
matches.  The optimizer objects, the prepared step (fastadam/optim/_prepared.py), the GPU
layout and kernel lists (fastadam/gpu) and the ONNX operator table read the specs from here.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

from . import _dense

# the C registry: name -> kind, and the size of each struct
_C_ROWS = {row["name"]: row for row in _dense.registry()}
KINDS = {name: row["kind"] for name, row in _C_ROWS.items()}
FLAG_BITS = (1, 2, 4, 8)  # the flag bits the kernels switch over (FA_FLAG_SWITCH)


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer as every Python table sees it.

    Attributes
    ----------
    name : str
        The row of optimizers.def (``"adam"``); ``kind`` follows from it.
    fields : tuple of str
        The float64 fields of ``fa_<name>_coeffs`` in declaration order.
    slots : tuple of str
        The state slot names of the functional steps, in kernel slot order (s0, s1, s2).
    object_slots : tuple of str
        The same slots as the optimizer objects name them (torch's names).
    flags : dict
        Option name -> flag bit (``{"amsgrad": 4}``); bits 1 (coupled decay) and 2 (loss
        scaling) are every optimizer's.
    fold : callable
        ``fold(t, **hyper)`` -> the coefficient object of step t.
    retime : callable or None
        ``retime(coeffs, t, hyper)`` -> the coefficient object of step ``t``, given ``coeffs``
        that ``fold`` returned for the same ``hyper`` at another step: it checks ``t`` as the
        fold does and recomputes only the fields that depend on it (Adam's bias corrections).
        A prepared step folds each set of hyper-parameters once and retimes it while the set
        is unchanged; None folds every step.
    slots_of : callable
        ``slots_of(flags)`` -> the indices into ``slots`` the kernels use with ``flags``,
        in kernel order (default: the first ``nslots(flags)``).
    defaults : dict
        Keyword values the fold needs when a caller gives none (Adam's fold has no
        defaults of its own; its functional step's are these).
    nonnegative_slots : tuple of str
        The functional slot names whose values never go negative (Adam ``v`` and ``v_max``,
        Adagrad ``h``, RMSprop ``square_avg``): 8-bit states store them with the unsigned
        quantization map, every other slot with the signed one.
    row_slots : tuple of str
        The functional slot names that hold one value per row of the parameter (rows: the
        first axis; shape ``x.shape[:1]``) instead of one per element: a row-wise optimizer's
        (a ``FA_ROWWISE_OPTIMIZER`` row of optimizers.def).  The optimizer objects and the
        sparse step shape these slots from it.
    onnx_op, torch_name : str or None
        The operator (``ai.onnx.preview.training``) and ``torch.optim`` class
        that compute the same update, or None.
    """

    name: str
    fields: Tuple[str, ...]
    slots: Tuple[str, ...]
    object_slots: Tuple[str, ...]
    fold: Callable
    flags: Dict[str, int] = field(default_factory=dict)
    slots_of: Optional[Callable[[int], Tuple[int, ...]]] = None
    retime: Optional[Callable] = None
    onnx_op: Optional[str] = None
    torch_name: Optional[str] = None
    defaults: Dict[str, object] = field(default_factory=dict)
    nonnegative_slots: Tuple[str, ...] = ()
    row_slots: Tuple[str, ...] = ()

    def __post_init__(self):
        for attr in ("nonnegative_slots", "row_slots"):
            unknown = [n for n in getattr(self, attr) if n not in self.slots]
            if unknown:
                raise ValueError(f"{self.name}: {attr} names {unknown[0]!r}, which is "
                                 f"not one of its slots {self.slots}")

    @property
    def rowwise(self) -> bool:
        """True for a row-wise optimizer (a FA_ROWWISE_OPTIMIZER row of optimizers.def)."""
        return bool(_C_ROWS[self.name].get("rowwise"))

    def slot_shape(self, name: str, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        """The shape of slot ``name`` (functional or object name) of a parameter of ``shape``:
        ``shape[:1]`` for a row slot, else ``shape``."""
        rows = set(self.row_slots)
        rows.update(o for f, o in zip(self.slots, self.object_slots) if f in self.row_slots)
        return tuple(shape[:1]) if name in rows else tuple(shape)

    @property
    def kind(self) -> int:
        return KINDS[self.name]

    def slot_indices(self, flags: int) -> Tuple[int, ...]:
        """Indices into ``slots`` of the state the kernels use with ``flags``, in slot order."""
        if self.slots_of is not None:
            return tuple(self.slots_of(flags))
        return tuple(range(_dense.nslots(self.kind, flags)))

    def dense_flag_sets(self):
        """Every flag combination the dense kernels take (the GPU instantiates each)."""
        return tuple(f for f in range(16) if _dense.dense_supported(self.kind, f))

    def sparse_flag_sets(self):
        """Every flag combination the sparse row walk takes."""
        return tuple(f for f in range(16) if _dense.sparse_supported(self.kind, f))


SPECS: Dict[str, OptimizerSpec] = {}
_BY_KIND: Dict[int, OptimizerSpec] = {}


def register(spec: OptimizerSpec) -> OptimizerSpec:
    """Add ``spec``; it must name a row of optimizers.def whose struct has its fields."""
    row = _C_ROWS.get(spec.name)
    if row is None:
        raise ValueError(f"{spec.name!r} is not in include/fastadam/optimizers.def "
                         f"(rows: {sorted(_C_ROWS)})")
    size = 8 * len(spec.fields) + 8  # doubles, then the int flags padded to 8 bytes
    if size != row["coeffs_size"]:
        raise ValueError(f"{spec.name}: {len(spec.fields)} float64 fields and flags take {size} "
                         f"bytes, but fa_{spec.name}_coeffs has {row['coeffs_size']}")
    if bool(row.get("rowwise")) != bool(spec.row_slots):
        raise ValueError(f"{spec.name}: a row-wise optimizer (FA_ROWWISE_OPTIMIZER) has row_slots "
                         f"and no other has (row_slots={spec.row_slots})")
    SPECS[spec.name] = spec
    _BY_KIND[spec.kind] = spec
    return spec


def spec(name: str) -> OptimizerSpec:
    """The spec of optimizer ``name``; ValueError naming the known ones otherwise."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"optimizer: expected one of {tuple(SPECS)}, got {name!r}") from None


def spec_of_kind(kind: int) -> OptimizerSpec:
    return _BY_KIND[kind]
