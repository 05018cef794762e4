"""Models: loading and checking a ``ModelProto``, checking feeds against the declared inputs, and
``run(model, feeds)``, which executes a graph once (core, optimizer and Gradient nodes alike).

External data.  A tensor may keep its bytes in a file beside the model (``data_location``
EXTERNAL, ``location`` relative to the model's folder).  Every tensor of a model -- the
initializers and node attributes of the inference graph, of every ``training_info`` graph and of
their sub-graphs -- is read into the model when it is loaded, from the model's own folder only:
a model given by path reads from its folder (``onnx.load`` for the inference graph, the same
checked reader for the rest); a ``ModelProto`` in memory has no folder, so one with external
references is refused unless the caller names the folder (``base_dir``).  onnx's reader refuses
a location outside that folder (``../``, an absolute path, a symbolic link).  After loading, no
tensor refers to a file, so nothing is read later (``initializer_arrays`` and the attribute
reader refuse one that still does) and ``TrainingSession.save`` writes only these bytes.
"""
import os

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from google.protobuf.message import DecodeError

from ..autodiff import Tensor
from ._graph import VALID_DATA_TYPES, Graph, UnsupportedOperatorError, onnx_dtype


def _graph_tensors(graph, where):
    """``(where, TensorProto)`` of every tensor ``graph`` holds: initializers (sparse ones'
    values and indices too) and node attributes, sub-graphs included."""
    for t in graph.initializer:
        yield f"initializer '{t.name}' of {where}", t
    for sp in graph.sparse_initializer:
        yield f"sparse initializer '{sp.values.name}' of {where}", sp.values
        yield f"sparse initializer '{sp.values.name}' (indices) of {where}", sp.indices
    for node in graph.node:
        for a in node.attribute:
            at = f"attribute '{a.name}' of node '{node.name or node.op_type}' in {where}"
            if a.HasField("t"):
                yield at, a.t
            for t in a.tensors:
                yield at, t
            for sp in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + \
                    list(a.sparse_tensors):
                yield at, sp.values
                yield at, sp.indices
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _graph_tensors(g, f"graph '{g.name}' of {at}")


def model_tensors(model):
    """``(where, TensorProto)`` of every tensor of ``model``: its graph, every
    ``training_info`` graph and every function's node attributes."""
    yield from _graph_tensors(model.graph, f"graph '{model.graph.name}'")
    for k, info in enumerate(model.training_info):
        yield from _graph_tensors(info.algorithm, f"training_info[{k}].algorithm")
        yield from _graph_tensors(info.initialization, f"training_info[{k}].initialization")
    for f in model.functions:
        for node in f.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield f"attribute '{a.name}' in function '{f.name}'", a.t
                for t in a.tensors:
                    yield f"attribute '{a.name}' in function '{f.name}'", t


def is_external(t):
    """True when the TensorProto ``t`` keeps its data in a file."""
    return t.data_location == onnx.TensorProto.EXTERNAL


def _location(t):
    return next((e.value for e in t.external_data if e.key == "location"), "")


def refuse_external(t, where):
    """The ValueError for a tensor still referring to a file where its bytes are read (never
    reached through ``load_model``, which reads them into the model)."""
    return ValueError(f"{where}: its data is in an external file ({_location(t)!r}), which "
                      f"fastadam.onnx reads only when the model is loaded (from its folder, or "
                      f"base_dir)")


def _read_external(model, base_dir, what):
    """Read every external tensor of ``model`` (modified: its bytes inlined) from ``base_dir``
    with onnx's checked reader; ValueError naming the tensor if one cannot be read there."""
    for where, t in model_tensors(model):
        if not is_external(t):
            continue
        try:
            external_data_helper.load_external_data_for_tensor(t, base_dir)
        except (onnx.checker.ValidationError, OSError, ValueError) as e:
            raise ValueError(f"model: {where}: its external data {_location(t)!r} cannot be "
                             f"read from {what}: {str(e).strip()}") from None
        t.data_location = onnx.TensorProto.DEFAULT  # (onnx 1.21 leaves these set)
        del t.external_data[:]


def _external_base(base_dir):
    if isinstance(base_dir, bool) or not isinstance(base_dir, (str, os.PathLike)):
        raise TypeError(f"base_dir: expected a folder (str or os.PathLike) or None, got "
                        f"{type(base_dir).__name__}")
    base = os.fspath(base_dir)
    if not os.path.isdir(base):
        raise ValueError(f"base_dir: {base!r} is not a folder")
    return base


def load_model(model, base_dir=None):
    """``model`` (a ModelProto or a path) with every tensor's data in it, checked by
    ``onnx.checker``.

    External data (see the module note) is read from the model's own folder when ``model`` is
    a path, and from ``base_dir`` for a ModelProto; a ModelProto with external references and
    no ``base_dir`` is refused.  A ModelProto given with external references is copied, never
    modified."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if base_dir is not None:
            raise ValueError(f"base_dir: the model {path!r} is given by path: its external data "
                             f"is read from its own folder (base_dir is for a ModelProto)")
        try:
            model = onnx.load(path)
        except DecodeError as e:
            raise ValueError(f"model: {path!r} is not a valid ONNX model (protobuf cannot "
                             f"parse it: {e})") from None
        except onnx.checker.ValidationError as e:  # external data outside the model's folder
            raise ValueError(f"model: {path!r}: onnx refuses its external data: "
                             f"{str(e).strip()}") from None
        # (onnx.load reads the inference graph's; the training_info graphs' are read here)
        if any(is_external(t) for _, t in model_tensors(model)):
            _read_external(model, os.path.dirname(os.path.abspath(path)), "the model's folder")
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model: expected an onnx.ModelProto or a path, got "
                        f"{type(model).__name__}")
    else:
        if base_dir is not None:
            base_dir = _external_base(base_dir)
        external = [(where, t) for where, t in model_tensors(model) if is_external(t)]
        if external:
            where, t = external[0]
            if base_dir is None:
                raise ValueError(
                    f"model: {where} keeps its data in an external file ({_location(t)!r}), "
                    f"and an in-memory ModelProto has no folder to read it from: pass "
                    f"base_dir (the folder that holds the model's external data), or give the "
                    f"model by its path")
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            _read_external(copy, base_dir, "base_dir")
            model = copy
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        raise ValueError(f"model: onnx.checker rejects it: {first}") from None
    except UnicodeError as e:  # a string field that is not UTF-8 (raised by the C checker)
        raise ValueError(f"model: a name or string attribute is not valid UTF-8 ({e})") from None
    return model


def check_tensor_types(*graphs):
    """Refuse graph inputs and outputs that are not tensors (sequences, maps, optionals)."""
    for g in graphs:
        for kind, infos in (("input", g.input), ("output", g.output)):
            for vi in infos:
                which = vi.type.WhichOneof("value")
                if which not in (None, "tensor_type"):
                    raise UnsupportedOperatorError(
                        f"graph '{g.name}': {kind} '{vi.name}' is a {which.replace('_type', '')}:"
                        f" only tensor types are supported (no sequence, map or optional types)")


def opsets(model):
    return {o.domain: o.version for o in model.opset_import}


def initializer_arrays(graph):
    """Writable copies of the graph's initializers (sparse initializers are refused)."""
    if len(graph.sparse_initializer):
        raise NotImplementedError(f"graph '{graph.name}': sparse initializers are not supported")
    out = {}
    for t in graph.initializer:
        if is_external(t):
            raise refuse_external(t, f"graph '{graph.name}': initializer '{t.name}'")
        if t.data_type not in VALID_DATA_TYPES:
            raise ValueError(f"graph '{graph.name}': initializer '{t.name}' has data_type "
                             f"{t.data_type}, which is not an ONNX tensor type")
        try:
            out[t.name] = np.array(numpy_helper.to_array(t))
        except (ValueError, TypeError) as e:
            raise ValueError(f"graph '{graph.name}': initializer '{t.name}' cannot be read "
                             f"({e})") from None
    return out


def _declared(value_info):
    """(dtype, shape with None for symbolic dimensions) of a tensor ValueInfoProto, or None."""
    t = value_info.type
    if t.WhichOneof("value") != "tensor_type":
        return None
    tt = t.tensor_type
    dtype = onnx_dtype(tt.elem_type, f"input '{value_info.name}'", "elem_type") \
        if tt.elem_type else None
    shape = None
    if tt.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return dtype, shape


class FeedChecker:
    """Checks feeds against ``inputs`` (ValueInfoProtos): names, dtypes, shapes.

    ``optional``: input names that have a default (initializers listed as inputs).  Calling it
    returns the feeds as Tensors (no copies).
    """

    def __init__(self, inputs, optional=()):
        self.declared = {vi.name: _declared(vi) for vi in inputs}
        self.required = [n for n in self.declared if n not in optional]
        # (names, ((dtype, shape), ...)) of the last feeds that passed, in order
        self._passed = (None, ())

    def _as_passed(self, feeds):
        """The feeds as Tensors when they have the names, order, dtypes and shapes of the last
        feeds that passed, every value an ndarray (the full check would pass again); else None."""
        names, specs = self._passed
        if names is None or tuple(feeds) != names:
            return None
        out = {}
        for (dtype, shape), (key, a) in zip(specs, feeds.items()):
            if a.__class__ is not np.ndarray or a.dtype is not dtype or a.shape != shape:
                return None
            out[key] = Tensor(a)
        return out

    def __call__(self, feeds):
        if not isinstance(feeds, dict):
            raise TypeError(f"feeds: expected a dict of input name -> array, got "
                            f"{type(feeds).__name__}")
        out = self._as_passed(feeds)
        if out is not None:
            return out
        self._passed = (None, ())
        declared = self.declared
        missing = [n for n in self.required if n not in feeds]
        if missing:
            raise ValueError(f"feeds: missing values for the inputs {missing}")
        out = {}
        for name, value in feeds.items():
            if name not in declared:
                raise ValueError(f"feeds: {sorted(set(feeds) - set(declared))} are not inputs "
                                 f"of the graph (inputs: {sorted(declared)})")
            a = value.data if isinstance(value, Tensor) else np.asarray(value)
            d = declared[name]
            if d is not None:
                dtype, shape = d
                if dtype is not None and a.dtype != dtype:
                    raise TypeError(f"feeds['{name}']: expected dtype {dtype}, got {a.dtype}")
                if shape is not None and (len(shape) != a.ndim or any(
                        d is not None and d != s for d, s in zip(shape, a.shape))):
                    shown = "(" + ", ".join("?" if d is None else str(d) for d in shape) + \
                        ("," if len(shape) == 1 else "") + ")"
                    raise ValueError(f"feeds['{name}']: expected shape {shown}, got {a.shape}")
            out[name] = Tensor(a)
        if all(v.__class__ is np.ndarray for v in feeds.values()):
            self._passed = (tuple(feeds), tuple((a.dtype, a.shape) for a in feeds.values()))
        return out


def check_feeds(inputs, feeds, optional=()):
    """``FeedChecker(inputs, optional)(feeds)``."""
    return FeedChecker(inputs, optional)(feeds)


def graph_known_names(*graphs):
    names = set()
    for g in graphs:
        names.update(vi.name for vi in g.input)
        names.update(t.name for t in g.initializer)
    return names


def bound_initializers(model):
    """Names of the initializers that the model's training info assigns (``update_binding``
    and ``initialization_binding`` keys): the trained ones, never constants of a Gradient."""
    return {b.key for info in model.training_info
            for b in list(info.update_binding) + list(info.initialization_binding)}


def run(model, feeds, output_names=None, *, base_dir=None):
    """Execute ``model``'s graph on ``feeds`` and return ``{output name: ndarray}``.

    The graph may mix core ``ai.onnx`` operators with ``ai.onnx.preview.training`` Adam, Adagrad,
    Momentum and Gradient nodes (see ``fastadam.onnx`` for the Gradient semantics).  Only the
    nodes needed for ``output_names`` (default: the graph's outputs) run; any graph tensor may be
    asked for.  Errors name the node; nothing in ``model`` is modified.

    ``model``: an ``onnx.ModelProto`` or a path.  ``base_dir``: the folder holding the external
    data of a ModelProto that has some (refused without it); a model given by path reads its
    external data from its own folder.
    """
    model = load_model(model, base_dir)
    graph = model.graph
    inits = initializer_arrays(graph)
    plan = Graph(graph.node, opsets(model), graph_known_names(graph),
                 constants=set(inits) - bound_initializers(model))
    check_tensor_types(graph)
    env = {}
    for name, a in inits.items():
        plan.assign(env, name, Tensor(a))
    for name, t in check_feeds(graph.input, feeds, optional=inits).items():
        plan.assign(env, name, t)
    if output_names is None:
        output_names = [o.name for o in graph.output]
    output_names = list(output_names)
    for name in output_names:
        if name not in plan.producer and name not in env:
            raise ValueError(f"output_names: '{name}' is not a tensor of the graph")
    plan.execute(env, plan.needed(output_names))
    return {name: env[name].data for name in output_names}
