"""Compiling and executing a list of ONNX nodes: core operators, optimizers and Gradient nodes.

``Graph(nodes, opsets, known, constants)`` checks everything that can be checked without values
(domains, opsets, operators, input names, variadic counts, what each Gradient node
differentiates) and turns each node into a ``Step``.  ``Graph.execute(env, order)`` runs the steps ``order`` (from
``Graph.needed(names)``, the steps some names depend on) on an environment ``name -> Tensor``;
every error a node raises is re-raised with the node's name and operator in front.
It compiles ``order`` once into a ``Program`` (a slot per tensor, one operation per node, every
per-node decision taken when it is built) and runs that; ``TrainingSession`` runs its steps on
``Program`` directly.

Gradient nodes.  A Gradient node names a sub-graph (``xs`` and ``zs`` in, ``y`` out) and gets
the values of ``xs + zs`` as inputs.  Its sub-graph (the nodes between them) is found when the
graph is compiled.  The spec asks ``xs`` and ``zs`` to be the minimal set that determines ``y``;
a constant in neither of them (a ``Constant`` node's output, or an initializer named in
``constants``: one the training info does not bind, such as the Reshape target shape an
exporter stores as an initializer) is read at its current value, as the forward pass reads it.
A graph input, or an initializer that training updates, outside ``xs`` and ``zs`` is an error.
At run time:

- if the node's inputs are the very tensors named by ``xs`` and ``zs`` and ``y`` has already been
  computed (the usual training graph), the forward pass is reused: every tensor named in some
  Gradient's ``xs`` was made a recorded leaf when it was assigned, so ``y`` is on the tape and
  ``fastadam.autodiff.gradient(y, xs, zs)`` is one backward walk;
- otherwise the sub-graph is re-evaluated from the node's inputs, then differentiated.

A non-scalar ``y`` (left undefined by the spec) is differentiated as the sum of its elements (a
seed of ones).  An ``x`` that ``y`` does not depend on gets a zero gradient.  A Gradient node
whose output lies in another Gradient node's sub-graph records its backward pass
(``create_graph=True``), which gives second and higher derivatives.
"""
import functools
import operator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import autodiff as ad
from ..autodiff import Tensor
from . import _nn_ops  # noqa: F401  (registers the neural-network operators)
from . import _transformer_ops  # noqa: F401  (registers the transformer operators)
from ._budget import step_scope
from ._core_ops import (COMPILERS, OPERATORS, VALID_DATA_TYPES, UnsupportedOperatorError,  # noqa: F401
                        onnx_dtype)
from ._folding import fold
from ._fusion import fuse
from ._training_ops import OPTIMIZERS, contiguous

TRAINING_DOMAIN = "ai.onnx.preview.training"
MIN_OPSET = 7
# the exceptions a node raises that are re-raised with the node's label in front
# (MemoryError and OverflowError too: an allocation the budget let through that still fails, or
# a count too large for a C integer, names its node like any other error)
LABELLED_ERRORS = (ValueError, TypeError, IndexError, NotImplementedError, ZeroDivisionError,
                   MemoryError, OverflowError)


def _attribute_value(a, label):
    """One attribute as a Python value (strings decoded, tensors as ndarrays); a malformed one
    raises ValueError naming ``label`` and the attribute."""
    try:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            onnx_dtype(v.data_type, f"{label}: attribute '{a.name}'", "data_type")
            if v.data_location == onnx.TensorProto.EXTERNAL:  # (load_model reads them all)
                raise ValueError(f"{label}: attribute '{a.name}': its data is in an external "
                                 f"file, which fastadam.onnx reads only when the model is loaded")
            v = numpy_helper.to_array(v)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode() for s in v]
    except UnicodeError:
        raise ValueError(f"{label}: attribute '{a.name}' is not valid UTF-8") from None
    except (ValueError, TypeError) as e:
        if str(e).startswith(label):
            raise
        raise ValueError(f"{label}: attribute '{a.name}' is malformed ({e})") from None
    return v


def attributes(node, label=None):
    """The node's attributes as Python values (strings decoded, tensors as ndarrays); a
    malformed attribute raises ValueError naming the node and the attribute."""
    label = label or f"node {node.op_type}"
    return {a.name: _attribute_value(a, label) for a in node.attribute}


@functools.lru_cache(maxsize=None)
def schema_defaults(op_type, opset, domain=""):
    """``{name: value}`` of the attributes with a default in the operator's schema at
    ``opset``, as ``attributes`` reads them: a float default is the float32 number a node that
    sets it would hold (LeakyRelu's alpha 0.01 is 0.009999999776482582), so that a node without
    the attribute computes what the same node with it does.  ``{}`` for an unknown schema."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return {}
    return {name: _attribute_value(a.default_value, f"schema {op_type}")
            for name, a in schema.attributes.items()
            if a.default_value.type != onnx.AttributeProto.UNDEFINED}


def _dense_gradients(xs, grads):
    """Gradients as dense Tensors: zeros for None (y does not depend on x), IndexedSlices made
    dense."""
    out = []
    for x, g in zip(xs, grads):
        if g is None:
            g = Tensor(np.zeros_like(x.data))
        elif not isinstance(g, Tensor):  # an IndexedSlices
            g = Tensor(g.to_dense())
        out.append(g)
    return out


def node_label(node, index):
    name = f"'{node.name}'" if node.name else f"#{index}"
    return f"node {name} ({node.op_type})"


class Step:
    """One compiled node: ``kind`` is "core", "optimizer" or "gradient"."""

    __slots__ = ("index", "node", "label", "kind", "inputs", "outputs", "run", "attrs",
                 "xs", "zs", "y", "subgraph", "constants", "differentiated", "inplace")

    def __init__(self, index, node):
        self.index = index
        self.node = node
        self.label = node_label(node, index)
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self.attrs = attributes(node, self.label)
        self.subgraph = None
        self.constants = ()  # initializers the Gradient's sub-graph reads as constants
        self.differentiated = False
        self.inplace = False


def supported_operators():
    """``{(domain, op_type): lowest opset}`` of every operator fastadam.onnx runs: the core
    ``ai.onnx`` operators (domain ``""``) up to the installed onnx's newest opset, each in the
    form its opset defines, and the ``ai.onnx.preview.training`` ones (opset 1).  Any other
    operator, and the forms the ONNX guide (docs/guide/onnx.md) lists as unsupported, raise
    ``UnsupportedOperatorError``."""
    out = {("", op): max(since, MIN_OPSET) for op, (since, _) in OPERATORS.items()}
    out.update({(TRAINING_DOMAIN, op): 1 for op in ("Gradient", *OPTIMIZERS)})
    return out


def _supported_opsets(opsets):
    core = opsets.get("", opsets.get("ai.onnx"))
    top = onnx.defs.onnx_opset_version()
    if core is not None and not MIN_OPSET <= core <= top:
        raise UnsupportedOperatorError(
            f"ai.onnx opset {core} is not supported: fastadam.onnx runs opsets {MIN_OPSET} to "
            f"{top} (the installed onnx's newest)")
    training = opsets.get(TRAINING_DOMAIN)
    if training is not None and training != 1:
        raise UnsupportedOperatorError(f"{TRAINING_DOMAIN} opset {training} is not supported "
                                       f"(only version 1 exists)")
    return core, training


class Graph:
    """Compiled nodes (see the module docstring).  ``known``: names defined before any node;
    ``constants``: those of them (initializers) that a Gradient node's sub-graph may read at
    their current value when they are in neither its ``xs`` nor its ``zs``."""

    def __init__(self, nodes, opsets, known, constants=()):
        self.core_opset, self.training_opset = _supported_opsets(opsets)
        self.constants = frozenset(constants)
        self.steps = []
        self.producer = {}
        defined = set(known)
        for i, node in enumerate(nodes):
            step = Step(i, node)
            self._compile(step)
            for name in step.inputs:
                if name and name not in defined:
                    raise ValueError(f"{step.label}: input '{name}' is not a graph input, an "
                                     f"initializer or the output of an earlier node")
            for name in step.outputs:
                if name:
                    if name in self.producer or name in known:
                        raise ValueError(f"{step.label}: output '{name}' is already defined")
                    self.producer[name] = i
                    defined.add(name)
            self.steps.append(step)
        self.known = set(known)
        self.grad_names = set()
        for step in self.steps:
            if step.kind == "gradient":
                self._gradient_subgraph(step)
                self.grad_names.update(step.xs)
        self._programs = {}  # compiled programs of ``execute``, by order
        # the tape may be freed by the backward walk when no other Gradient node walks it again
        self.retain_graph = sum(s.kind == "gradient" for s in self.steps) > 1
        for step in self.steps:
            if step.kind == "gradient":
                for k in step.subgraph:
                    if self.steps[k].kind == "gradient":
                        self.steps[k].differentiated = True

    # -- compilation ---------------------------------------------------------------------------

    def _compile(self, step):
        node = step.node
        domain = node.domain
        if domain in ("", "ai.onnx"):
            if self.core_opset is None:
                raise UnsupportedOperatorError(f"{step.label}: the model imports no ai.onnx opset")
            entry = OPERATORS.get(node.op_type)
            if entry is None or self.core_opset < entry[0]:
                raise UnsupportedOperatorError(
                    f"{step.label}: operator {node.op_type} of domain ai.onnx opset "
                    f"{self.core_opset} is not supported by fastadam.onnx" +
                    (f" (supported from opset {entry[0]})" if entry else ""))
            # a missing attribute takes the schema's default (float32 numbers, as set ones)
            step.attrs = {**schema_defaults(node.op_type, self.core_opset), **step.attrs}
            fun, opset, attrs = entry[1], self.core_opset, step.attrs
            n_out = len(node.output)
            make = COMPILERS.get(node.op_type)
            if make is not None and n_out == 1:
                step.run = make(attrs, opset)
            elif "n_outputs" in fun.__code__.co_varnames:
                step.run = lambda inputs: fun(inputs, attrs, opset, n_outputs=n_out)
            else:
                if n_out > 1:
                    raise UnsupportedOperatorError(
                        f"{step.label}: only the first output of {node.op_type} is supported, "
                        f"got {n_out} outputs")
                step.run = lambda inputs: fun(inputs, attrs, opset)
            step.kind = "core"
        elif domain == TRAINING_DOMAIN:
            if self.training_opset is None:
                raise UnsupportedOperatorError(f"{step.label}: the model imports no "
                                               f"{TRAINING_DOMAIN} opset")
            if node.op_type == "Gradient":
                self._compile_gradient(step)
            elif node.op_type in OPTIMIZERS:
                self._compile_optimizer(step)
            else:
                raise UnsupportedOperatorError(f"{step.label}: operator {node.op_type} of domain "
                                               f"{TRAINING_DOMAIN} opset 1 does not exist")
        else:
            raise UnsupportedOperatorError(f"{step.label}: domain '{domain}' (operator "
                                           f"{node.op_type}) is not supported by fastadam.onnx")

    def _compile_optimizer(self, step):
        fun, _, per, written, defaults = OPTIMIZERS[step.node.op_type]
        attrs = dict(defaults)
        unknown = set(step.attrs) - set(defaults)
        if unknown:
            raise ValueError(f"{step.label}: unknown attributes {sorted(unknown)}")
        attrs.update(step.attrs)
        missing = [k for k, v in attrs.items() if v is None]
        if missing:
            raise ValueError(f"{step.label}: missing required attributes {missing}")
        n_in = len(step.inputs) - 2
        if n_in <= 0 or n_in % per:
            raise ValueError(f"{step.label}: expected R, T and then a positive multiple of {per} "
                             f"inputs, got {len(step.inputs)} inputs in all")
        n = n_in // per
        if len(step.outputs) != n * len(written):
            raise ValueError(f"{step.label}: expected {n * len(written)} outputs for {n} "
                             f"optimized tensors, got {len(step.outputs)}")
        if any(not name for name in step.inputs):
            raise ValueError(f"{step.label}: every input is required")
        step.kind = "optimizer"
        step.attrs = attrs
        step.run = lambda inputs: [Tensor(a) for a in fun(*[t.data for t in inputs], **attrs)]

    def _compile_gradient(self, step):
        a = step.attrs
        if "xs" not in a or "y" not in a:
            raise ValueError(f"{step.label}: attributes xs and y are required")
        step.xs, step.zs, step.y = list(a["xs"]), list(a.get("zs", [])), a["y"]
        names = step.xs + step.zs
        if len(set(names)) != len(names):
            raise ValueError(f"{step.label}: xs and zs must name distinct tensors, got xs={step.xs}"
                             f", zs={step.zs}")
        if len(step.inputs) != len(names):
            raise ValueError(f"{step.label}: expected {len(names)} inputs (the values of xs then "
                             f"zs), got {len(step.inputs)}")
        if len(step.outputs) != len(step.xs):
            raise ValueError(f"{step.label}: expected {len(step.xs)} outputs (one per xs), got "
                             f"{len(step.outputs)}")
        if any(not name for name in step.inputs):
            raise ValueError(f"{step.label}: every input is required")
        step.kind = "gradient"
        step.run = None

    def _gradient_subgraph(self, step):
        """The steps between ``xs + zs`` and ``y``, or an error if they do not determine ``y``."""
        sources = set(step.xs) | set(step.zs)
        seen, found, stack = set(), set(), [step.y]
        constants = []
        while stack:
            name = stack.pop()
            if name in seen or name in sources:
                continue
            seen.add(name)
            k = self.producer.get(name)
            if k is None:
                if name in self.constants:  # read at its current value
                    constants.append(name)
                    continue
                where = ("a graph input, or an initializer that the training info updates"
                         if name in self.known else "undefined")
                raise ValueError(
                    f"{step.label}: y '{step.y}' depends on '{name}' ({where}), which is in "
                    f"neither xs nor zs: xs and zs must determine y")
            if k == step.index:
                raise ValueError(f"{step.label}: y '{step.y}' depends on this Gradient node's "
                                 f"own output")
            other = self.steps[k]
            if other.kind == "optimizer":
                raise ValueError(f"{step.label}: y '{step.y}' depends on {other.label}, which is "
                                 f"not differentiable")
            found.add(k)
            if other.kind == "gradient":  # re-evaluated here, it reads its own constants
                constants.extend(other.constants)
            stack.extend(n for n in self.steps[k].inputs if n)
        step.subgraph = sorted(found)
        step.constants = tuple(sorted(set(constants)))

    # -- execution -----------------------------------------------------------------------------

    def needed(self, wanted):
        """Indices of the steps that ``wanted`` names depend on, in order."""
        seen, found, stack = set(), set(), list(wanted)
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            k = self.producer.get(name)
            if k is not None and k not in found:
                found.add(k)
                step = self.steps[k]
                stack.extend(n for n in step.inputs if n)
                if step.kind == "gradient":  # y computed before the node: its forward pass is
                    stack.append(step.y)     # reused (no re-evaluation of the sub-graph)
        return sorted(found)

    def assign(self, env, name, value):
        """Bind ``value``; a tensor some Gradient differentiates becomes a recorded leaf."""
        if name in self.grad_names:
            value = self.leaf(value)
        env[name] = value

    @staticmethod
    def leaf(value):
        """``value`` as a tensor some Gradient differentiates: a recorded leaf if floating."""
        if not value.requires_grad and value.data.dtype.kind == "f":
            value = Tensor(value.data, requires_grad=True)
        return value

    @staticmethod
    def relabel(step, e):
        """The error ``e`` raised by ``step`` with the step's label in front (``e`` itself when
        it already names a node)."""
        msg = str(e)
        if msg.startswith("node "):
            return e
        if msg.startswith(step.node.op_type + ": "):
            msg = msg[len(step.node.op_type) + 2:]
        return type(e)(f"{step.label}: {msg}")

    def execute(self, env, order, keep=None):
        """Run the steps ``order`` (indices) on ``env`` (name -> Tensor): their outputs are
        added to ``env`` (with ``keep``, the names read afterwards, only those: the program may
        then run node patterns as one operation, ``_fusion``).  The program for ``order`` is
        compiled at its first run and kept.

        With Gradient nodes the forward pass must be recorded, so recording is switched on
        for the call even inside ``fastadam.autodiff.no_grad()``."""
        key = (tuple(order), None if keep is None else frozenset(keep))
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = Program(self, order, keep)
        with step_scope():  # the per-step memory budget (_budget.py)
            slots = program.load(env)
            if not self.grad_names:
                program.run(slots)
            else:
                previous = ad.set_grad_enabled(True)
                try:
                    program.run(slots)
                finally:
                    ad.set_grad_enabled(previous)
        program.store(slots, env)

    # -- the callables of optimizer and Gradient nodes ------------------------------------------

    def _gradient_runner(self, step, reuse_known):
        """``run(values)`` for a Gradient node, ``values`` being its inputs, then (unless
        ``reuse_known``) the current values of the tensors named by its ``xs`` and ``zs``
        (None where there is none), then the constants its sub-graph reads (initializers the
        training info does not bind, at their current value), then the current ``y`` (None when
        not computed yet).

        When ``y`` was computed from these very input tensors in this pass (``reuse_known``:
        the node's inputs are the tensors named by ``xs`` and ``zs``, so only ``y`` is to be
        tested), its forward pass is on the tape: one backward walk.  Otherwise the sub-graph is
        re-evaluated from the inputs, then differentiated."""
        xs_names, zs_names, y_name = step.xs, step.zs, step.y
        nx, n_in = len(xs_names), len(step.inputs)
        differentiate = self._differentiation(step)

        constants = step.constants
        n_const = len(constants)
        wanted = {y_name, *xs_names, *zs_names}

        def reevaluate(inputs, values):
            sub = dict(zip(constants, values[len(values) - 1 - n_const:-1]))
            for n, t in zip(xs_names + zs_names, inputs):
                if n in xs_names and not t.requires_grad and t.data.dtype.kind == "f":
                    t = Tensor(t.data, requires_grad=True)
                sub[n] = t
            # (the names read back: the sub-graph runs as the session's step runs it, fused)
            self.execute(sub, step.subgraph, keep=wanted)
            return sub[y_name], [sub[n] for n in xs_names], [sub[n] for n in zs_names]

        def run(values):
            y = values[-1]
            if y is not None and (reuse_known or all(
                    a is b for a, b in zip(values[n_in:2 * n_in], values[:n_in]))):
                xs, zs = values[:nx], values[nx:n_in]
            else:
                y, xs, zs = reevaluate(values[:n_in], values)
            return differentiate(y, xs, zs)
        return run

    def _differentiation(self, step):
        """``differentiate(y, xs, zs)``: the Gradient node's outputs, ``d y / d xs`` (zeros where
        y does not depend on x), by one backward walk from ``y`` computed from these ``xs``
        and ``zs`` (its forward pass on the tape).  ``autodiff.gradient`` records the walk
        exactly when ``create_graph`` is on (a Gradient of this node's output)."""
        xs_names, y_name = step.xs, step.y
        retain, create = self.retain_graph, step.differentiated
        gradient, ones_like = ad.gradient, np.ones_like

        def differentiate(y, xs, zs):
            for x in xs:
                if x.data.dtype.kind != "f":
                    n, x = next((n, x) for n, x in zip(xs_names, xs) if x.data.dtype.kind != "f")
                    raise TypeError(f"xs '{n}': expected a floating-point tensor, got "
                                    f"{x.data.dtype}")
            yd = y.data
            if yd.dtype.kind != "f":
                raise TypeError(f"y '{y_name}': expected a floating-point tensor, got {yd.dtype}")
            for z in zs:
                if z._node is not None or z.requires_grad:
                    break
            else:  # no z is on the tape (feeds, constants): stopping at them changes nothing
                zs = ()
            grads = gradient(y, xs, zs, grad_output=None if yd.size == 1 else ones_like(yd),
                             retain_graph=retain, create_graph=create, allow_unused=True)
            for g in grads:
                if g.__class__ is not Tensor:  # None (y does not depend on x) or IndexedSlices
                    return _dense_gradients(xs, grads)
            return grads
        return differentiate


def _as_leaves(fun, leaves):
    """``fun`` whose outputs flagged in ``leaves`` become recorded leaves (``Graph.leaf``)."""
    leaf = Graph.leaf

    def run(inputs):
        return [leaf(v) if is_leaf else v for v, is_leaf in zip(fun(inputs), leaves)]
    return run


# the two reserved slots of every program: an omitted optional input reads slot 0 (always None);
# an omitted output is written to slot 1 (never read)
_ABSENT, _DISCARDED = 0, 1


def _slot_operation(fun, fetch, outs, drop, single=None):
    """``op(slots)``: the node's outputs ``fun(fetch(slots))`` stored in the slots ``outs``,
    then the slots ``drop`` cleared (written out for the usual one output and one drop, and for
    a node with one input, ``single``, its slot)."""
    if single is not None and len(outs) == 1 and not drop:
        out, = outs

        def op(slots):
            slots[out] = fun((slots[single],))[0]
    elif single is not None and len(outs) == 1 and len(drop) == 1:
        (out,), (cleared,) = outs, drop

        def op(slots):
            slots[out] = fun((slots[single],))[0]
            slots[cleared] = None
    elif len(outs) == 1 and not drop:
        out, = outs

        def op(slots):
            slots[out] = fun(fetch(slots))[0]
    elif len(outs) == 1 and len(drop) == 1:
        (out,), (cleared,) = outs, drop

        def op(slots):
            slots[out] = fun(fetch(slots))[0]
            slots[cleared] = None
    else:
        def op(slots):
            for i, value in zip(outs, fun(fetch(slots))):
                slots[i] = value
            for i in drop:
                slots[i] = None
    return op


class Program:
    """Steps of a ``Graph`` compiled over a flat list of slots, one per tensor name.

    Built once for a list of step indices ``order``; every per-node decision is taken here:
    each tensor name gets a slot index, each step becomes one *operation* ``(step, op)``,
    ``op(slots)`` being ``outs <- fun(fetch(slots))`` then ``drop`` (``_operation``): ``fun`` the
    node's callable (attributes folded by the operator's compiler, an in-place optimizer's
    input ranges computed, a Gradient node's forward-reuse test decided), ``fetch(slots)`` the
    tuple of its inputs, ``outs`` the slots its outputs go to (outputs nothing reads go nowhere),
    ``drop`` the slots cleared after their last use (only when ``keep``, the names read after
    the program, is given: the tape alone then holds those tensors, and the backward walk frees
    them as it goes; with ``keep`` too, node patterns such as attention's MatMul, Add, Softmax,
    MatMul run as one operation, ``_fusion``, and shape computations run once per input
    signature, ``_folding``).  A Gradient node whose inputs are the tensors named by its ``xs`` and
    ``zs`` (the backward walk on the forward pass just run) and an in-place optimizer node get
    operations of their own (``_gradient_operation``, ``_inplace_operation``) that read the
    slots directly.  ``layout`` keeps each operation's ``(outs, drop)`` for ``describe``.

    ``load(env)`` makes the slots from an environment ``name -> Tensor`` (the names the
    program reads before it writes them; a missing one is an error naming the first node that
    reads it); ``run(slots, ops)`` runs operations, each error re-raised with its node's
    label; ``store(slots, env)`` adds what the program produced to ``env``.  ``describe()``
    lists the operations, one line per node, for reading and debugging.
    """

    __slots__ = ("graph", "ops", "layout", "names", "slot", "loaded", "soft", "_get", "_blank",
                 "folded")

    def __init__(self, graph, order, keep=None):
        steps = [graph.steps[k] for k in order]
        if keep is not None:  # node patterns run as one operation (_fusion)
            steps = fuse(graph, steps, keep, LABELLED_ERRORS)
            order = [s.index for s in steps]
        produced = {n for s in steps for n in s.outputs if n}
        loaded, soft = [], []  # read before written: required / looked up if present
        seen = set()

        def reads(name, required):
            if name and name not in produced and name not in seen:
                seen.add(name)
                (loaded if required else soft).append(name)
        for s in steps:
            for n in s.inputs:
                reads(n, True)
        for s in steps:
            if s.kind == "gradient":
                for n in s.xs + s.zs + list(s.constants) + [s.y]:
                    reads(n, False)
        for n in keep or ():
            reads(n, True)
        self.names = ["(absent)", "(discarded)"] + loaded + soft + \
            sorted(produced, key=lambda n: (graph.producer[n], n))
        self.slot = {n: i for i, n in enumerate(self.names) if i >= 2}
        self.loaded, self.soft = loaded, soft
        self.graph = graph
        if len(loaded) > 1:
            self._get = operator.itemgetter(*loaded)
        else:
            self._get = (lambda env, n=loaded[0]: (env[n],)) if loaded else (lambda env: ())
        self._blank = [None] * (len(self.names) - 2 - len(loaded) - len(soft))
        # the last operation that reads each name; what is not kept is dropped after it
        last_use = {}
        for i, s in enumerate(steps):
            for n in s.inputs + ([s.y] + s.xs + s.zs if s.kind == "gradient" else []):
                last_use[n] = i
            for n in s.outputs:
                last_use.setdefault(n, i)
        drops = [[] for _ in steps]
        unread = set()  # outputs nothing reads: written to the discarded slot
        if keep is not None:
            for n, i in last_use.items():
                if n in produced and n not in keep:
                    if graph.producer[n] == order[i]:
                        unread.add(n)
                    elif i < len(steps) - 1:  # (after the last operation, the slots go)
                        drops[i].append(self.slot[n])
        self.ops, self.layout, self.folded = [], [], frozenset()
        for s, d in zip(steps, drops):
            fun, fetch, outs = self._operation(s, unread)
            if s.kind == "gradient" and s.inputs == s.xs + s.zs and \
                    not any(n in graph.grad_names for n in s.outputs):
                op = self._gradient_operation(s, fun, fetch, outs, tuple(d))
            elif s.inplace:
                op = self._inplace_operation(s, outs, tuple(d))
            else:
                single = self.slot[s.inputs[0]] if len(s.inputs) == 1 and s.inputs[0] and \
                    s.kind == "core" else None
                op = _slot_operation(fun, fetch, outs, tuple(d), single)
            self.ops.append((s, op))
            self.layout.append((outs, tuple(d)))
        if keep is not None:  # shape computations reused while the input shapes stay (_folding)
            self.ops = fold(self, steps, self.ops, self.layout, keep, graph)

    def _operation(self, step, unread):
        """``(fun, fetch, outs)`` of one step (see the class note)."""
        graph, slot = self.graph, self.slot
        ins = [slot[n] if n else _ABSENT for n in step.inputs]
        if step.kind == "gradient":
            reuse_known = step.inputs == step.xs + step.zs
            if not reuse_known:  # the reuse test compares the inputs with the named tensors
                ins += [slot[n] for n in step.xs + step.zs]
            ins += [slot[n] for n in step.constants]  # read by a re-evaluated sub-graph
            ins.append(slot[step.y])
            fun = graph._gradient_runner(step, reuse_known)
        elif step.inplace:  # (its operation is _inplace_operation)
            fun = None
        else:
            fun = step.run
        leaves = [n in graph.grad_names for n in step.outputs]
        if any(leaves):  # a tensor some Gradient differentiates: a recorded leaf
            fun = _as_leaves(fun, leaves)
        if len(ins) > 1:
            fetch = operator.itemgetter(*ins)
        elif ins:
            fetch = lambda slots, i=ins[0]: (slots[i],)  # noqa: E731
        else:  # Constant
            fetch = lambda slots: ()  # noqa: E731
        if "" in step.inputs:  # operators with omitted optional inputs are handed a list
            fetch = lambda slots, get=fetch: list(get(slots))  # noqa: E731
        outs = [slot[n] if n and n not in unread else _DISCARDED for n in step.outputs]
        while outs and outs[-1] == _DISCARDED:  # the outputs are stored by zip(outs, values)
            outs.pop()
        return fun, fetch, tuple(outs)

    def _gradient_operation(self, step, fun, fetch, outs, drop):
        """A Gradient node whose inputs are the tensors named by its ``xs`` and ``zs``: when
        ``y`` has been computed, one backward walk (``Graph._differentiation``) on the slots;
        else ``fun`` (the sub-graph re-evaluated)."""
        slot = self.slot
        xs = operator.itemgetter(*[slot[n] for n in step.xs], slot[step.y])
        zs = [slot[n] for n in step.zs]
        zs = operator.itemgetter(*zs, _ABSENT) if zs else (lambda slots: (None,))
        y_slot = slot[step.y]
        differentiate = self.graph._differentiation(step)

        def op(slots):
            if slots[y_slot] is None:  # y not computed yet: re-evaluate the sub-graph
                values = fun(fetch(slots))
            else:  # (each getter ends with one more slot, so that it returns a tuple)
                xs_y, zs_ = xs(slots), zs(slots)
                values = differentiate(xs_y[-1], xs_y[:-1], zs_[:-1])
            for i, value in zip(outs, values):
                slots[i] = value
            for i in drop:
                slots[i] = None
        return op

    def _inplace_operation(self, step, outs, drop):
        """An optimizer node run on its input arrays themselves (see ``TrainingSession``): the
        update, with the X/G/state index ranges computed once; its outputs are its written
        inputs, which now hold the new values (stored in ``outs``, usually none: nothing reads
        them); then the slots ``drop`` cleared."""
        _, apply, per, written, _ = OPTIMIZERS[step.node.op_type]
        n = (len(step.inputs) - 2) // per
        inputs_of = operator.itemgetter(*[self.slot[name] for name in step.inputs])
        split = operator.itemgetter(*[slice(2 + k * n, 2 + (k + 1) * n) for k in range(per)])
        new_values = operator.itemgetter(*[2 + k * n + i for k in written for i in range(n)])
        grads = slice(2 + n, 2 + 2 * n)
        data, attrs = operator.attrgetter("data"), step.attrs
        cache = {}  # the prepared steps of this node's arrays (_training_ops._apply)
        last = [None, None]  # the inputs but R, T and G of the last step, and its lists

        def op(slots):
            inputs = inputs_of(slots)
            lists = last[1]
            if lists is not None and all(map(operator.is_, last[0], inputs[2:2 + n])) and \
                    all(map(operator.is_, last[0][n:], inputs[2 + 2 * n:])):
                # the same Tensors as the last step: the same arrays (the session replaces
                # a state Tensor whenever it replaces its array)
                lists[1] = list(map(contiguous, map(data, inputs[grads])))
            else:
                arrays = list(map(data, inputs))
                lists = list(split(arrays))  # X, G, then the states
                lists[1] = list(map(contiguous, lists[1]))  # gradients are only read
                last[0] = inputs[2:2 + n] + inputs[2 + 2 * n:]
                last[1] = lists
            try:
                apply(inputs[0].data, inputs[1].data, lists, cache=cache, **attrs)
            finally:
                lists[1] = None  # (the gradients are not kept past the step)
            if outs:
                for i, value in zip(outs, new_values(inputs)):
                    slots[i] = value
            for i in drop:
                slots[i] = None
        return op

    def load(self, env):
        """The slots of a run on ``env`` (name -> Tensor)."""
        try:
            values = self._get(env)
        except KeyError as e:
            raise self._missing(e.args[0]) from None
        if self.soft:
            return [None, None, *values, *[env.get(n) for n in self.soft], *self._blank]
        return [None, None, *values, *self._blank]

    def _missing(self, name):
        for step, _ in self.ops:
            if name in step.inputs:
                return ValueError(f"{step.label}: input {name!r} has no value (a missing feed?)")
        return ValueError(f"{name!r} has no value (a missing feed?)")

    def run(self, slots, ops=None):
        """Run ``ops`` (default: all operations, in order) on ``slots``.  A program with
        Gradient nodes runs with recording on (the caller switches it on)."""
        step = None
        try:
            for step, op in self.ops if ops is None else ops:
                op(slots)
        except LABELLED_ERRORS as e:
            labelled = e if step is None else self.graph.relabel(step, e)
            if labelled is e:
                raise
            raise labelled from e

    def store(self, slots, env):
        """Add the tensors the program produced to ``env``."""
        names = self.names
        for i in range(2 + len(self.loaded) + len(self.soft), len(names)):
            if slots[i] is not None:
                env[names[i]] = slots[i]

    def describe(self):
        """The operations, one line per node: ``label: inputs -> outputs`` by tensor name and
        slot, and the slots cleared after it."""
        names, lines = self.names, []
        for k, ((step, _), (outs, drop)) in enumerate(zip(self.ops, self.layout)):
            ins = ", ".join(f"{n}@{self.slot[n]}" if n else "(absent)" for n in step.inputs)
            outs += (_DISCARDED,) * (len(step.outputs) - len(outs))
            out = ", ".join(f"{names[i]}@{i}" if i > _DISCARDED else names[i] for i in outs)
            line = f"{step.label}: {ins} -> {out}"
            if step.inplace:
                line += "  (in place)"
            if k in self.folded:
                line += "  (folded)"
            if drop:
                line += "; drop " + ", ".join(names[i] for i in drop)
            lines.append(line)
        return "\n".join(lines)
