"""Compiling and executing a list of ONNX nodes: core operators, optimizers and Gradient nodes.

``Graph(nodes, opsets, known)`` checks everything that can be checked without values (domains,
opsets, operators, input names, variadic counts, what each Gradient node differentiates) and
turns each node into a ``Step``.  ``Graph.execute(env, order)`` runs the steps ``order`` (from
``Graph.needed(names)``, the steps some names depend on) on an environment ``name -> Tensor``;
every error a node raises is re-raised with the node's name and operator in front.
``Graph.compile(order)`` / ``Graph.run_program(env, program)`` do the same with the per-node
decisions taken once (``TrainingSession`` runs its steps this way).

Gradient nodes.  A Gradient node names a sub-graph (``xs`` and ``zs`` in, ``y`` out) and gets
the values of ``xs + zs`` as inputs.  Its sub-graph (the nodes between them) is found when the
graph is compiled; when ``xs`` and ``zs`` cannot determine ``y`` that is an error.  At run time:

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
import operator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import autodiff as ad
from ..autodiff import Tensor
from . import _nn_ops  # noqa: F401  (registers the neural-network operators)
from . import _transformer_ops  # noqa: F401  (registers the transformer operators)
from ._core_ops import COMPILERS, OPERATORS, UnsupportedOperatorError
from ._training_ops import OPTIMIZERS, contiguous

TRAINING_DOMAIN = "ai.onnx.preview.training"
MIN_OPSET = 7
# the exceptions a node raises that are re-raised with the node's label in front
LABELLED_ERRORS = (ValueError, TypeError, IndexError, NotImplementedError, ZeroDivisionError)


def attributes(node):
    """The node's attributes as Python values (strings decoded, tensors as ndarrays)."""
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode() for s in v]
        out[a.name] = v
    return out


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
                 "xs", "zs", "y", "subgraph", "differentiated", "inplace")

    def __init__(self, index, node):
        self.index = index
        self.node = node
        self.label = node_label(node, index)
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self.attrs = attributes(node)
        self.subgraph = None
        self.differentiated = False
        self.inplace = False


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
    """Compiled nodes (see the module docstring).  ``known``: names defined before any node."""

    def __init__(self, nodes, opsets, known):
        self.core_opset, self.training_opset = _supported_opsets(opsets)
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

    @staticmethod
    def run_inplace(step, inputs):
        """An optimizer step on its input arrays themselves (see ``TrainingSession``)."""
        _, apply, per, written, _ = OPTIMIZERS[step.node.op_type]
        arrays = [t.data for t in inputs[2:]]
        n = len(arrays) // per
        lists = [arrays[k * n:(k + 1) * n] for k in range(per)]
        lists[1] = [contiguous(g) for g in lists[1]]  # gradients are only read
        apply(inputs[0].data, inputs[1].data, lists, **step.attrs)
        return [inputs[2 + k * n + i] for k in written for i in range(n)]  # now the new values

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
        while stack:
            name = stack.pop()
            if name in seen or name in sources:
                continue
            seen.add(name)
            k = self.producer.get(name)
            if k is None:
                where = "a graph input or initializer" if name in self.known else "undefined"
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
            stack.extend(n for n in self.steps[k].inputs if n)
        step.subgraph = sorted(found)

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

    def execute(self, env, order):
        """Run the steps ``order`` (indices) on ``env`` (name -> Tensor), in place.

        With Gradient nodes the forward pass must be recorded, so recording is switched on
        for the call even inside ``fastadam.autodiff.no_grad()``."""
        if not self.grad_names:
            return self._execute(env, order)
        previous = ad.set_grad_enabled(True)
        try:
            return self._execute(env, order)
        finally:
            ad.set_grad_enabled(previous)

    def _execute(self, env, order):
        steps = self.steps
        for k in order:
            step = steps[k]
            try:
                inputs = [env[n] if n else None for n in step.inputs]
            except KeyError as e:
                raise ValueError(f"{step.label}: input {e} has no value (a missing feed?)") \
                    from None
            try:
                if step.kind == "gradient":
                    outs = self._run_gradient(step, inputs, env)
                elif step.inplace:
                    outs = self.run_inplace(step, inputs)
                else:
                    outs = step.run(inputs)
            except LABELLED_ERRORS as e:
                labelled = self.relabel(step, e)
                if labelled is e:
                    raise
                raise labelled from e
            leaves = self.grad_names
            for name, value in zip(step.outputs, outs):
                if name in leaves:
                    self.assign(env, name, value)
                elif name:
                    env[name] = value

    # -- compiled programs (the training session's per-step fast path) --------------------------

    def compile(self, order, keep=None):
        """The steps ``order`` as a program for ``run_program``: per step, its callable resolved
        (attributes folded by the operator's compiler, an in-place optimizer's input lists
        pre-split, a Gradient node's forward-reuse test decided), a getter of its inputs, how
        its outputs are stored and, when ``keep`` (the names wanted afterwards) is given, the
        intermediate tensors to drop from ``env`` after their last use (the tape alone then holds
        them, and the backward walk frees them as it goes).  Running a program does what
        ``_execute(env, order)`` does, with less work per node."""
        last_use = {}
        for i, k in enumerate(order):
            step = self.steps[k]
            for n in step.inputs + ([step.y] if step.kind == "gradient" else []):
                last_use[n] = i
            for n in step.outputs:
                last_use.setdefault(n, i)
        drops = [[] for _ in order]
        if keep is not None:
            produced = {n for k in order for n in self.steps[k].outputs if n}
            for n, i in last_use.items():
                if n in produced and n not in keep:
                    drops[i].append(n)
        program = []
        for i, k in enumerate(order):
            step = self.steps[k]
            ins = step.inputs
            if step.kind == "gradient":
                fun, wants_env = self._gradient_runner(step), True
            elif step.inplace:
                fun, wants_env = self._inplace_runner(step), False
            else:
                fun, wants_env = step.run, False
            # inputs: a tuple from one C call, unless some optional input is omitted ("")
            if "" in ins:
                fetch = None
            elif not ins:  # Constant
                fetch = lambda env: ()  # noqa: E731
            elif len(ins) == 1:
                name = ins[0]
                fetch = lambda env, name=name: (env[name],)  # noqa: E731
            else:
                fetch = operator.itemgetter(*ins)
            # outputs: plain stores unless one is omitted or is a Gradient's differentiated leaf
            plain = all(n and n not in self.grad_names for n in step.outputs)
            outs = tuple(step.outputs) if plain else None
            program.append((step, fun, fetch, wants_env, outs, tuple(drops[i])))
        return program

    def run_program(self, env, program):
        """Run a program from ``compile`` on ``env``; errors are labelled as in ``_execute``.
        A program with Gradient nodes runs with recording on (the caller switches it on)."""
        step = None
        try:
            for step, fun, fetch, wants_env, outs, drop in program:
                try:
                    inputs = fetch(env) if fetch is not None else \
                        [env[n] if n else None for n in step.inputs]
                except KeyError as e:
                    raise ValueError(f"{step.label}: input {e} has no value (a missing feed?)") \
                        from None
                values = fun(inputs, env) if wants_env else fun(inputs)
                if outs is not None:
                    for name, value in zip(outs, values):
                        env[name] = value
                else:
                    leaves = self.grad_names
                    for name, value in zip(step.outputs, values):
                        if name in leaves:
                            self.assign(env, name, value)
                        elif name:
                            env[name] = value
                for name in drop:
                    del env[name]
        except LABELLED_ERRORS as e:
            labelled = e if step is None else self.relabel(step, e)
            if labelled is e:
                raise
            raise labelled from e

    def _inplace_runner(self, step):
        """``run_inplace`` with the X/G/state index ranges computed once."""
        _, apply, per, written, _ = OPTIMIZERS[step.node.op_type]
        n = (len(step.inputs) - 2) // per
        bounds = [(2 + k * n, 2 + (k + 1) * n) for k in range(per)]
        returned = [2 + k * n + i for k in written for i in range(n)]
        attrs = step.attrs

        def run(inputs):
            lists = [[t.data for t in inputs[a:b]] for a, b in bounds]
            lists[1] = [g if g.flags.c_contiguous else contiguous(g) for g in lists[1]]
            apply(inputs[0].data, inputs[1].data, lists, **attrs)
            return [inputs[i] for i in returned]  # now the new values
        return run

    def _gradient_runner(self, step):
        """``_run_gradient``, with the test "are the inputs the very tensors named by xs and
        zs?" decided once when the node's input names are those names (the usual case)."""
        if step.inputs != step.xs + step.zs:
            return lambda inputs, env: self._run_gradient(step, inputs, env)
        nx, y_name = len(step.xs), step.y
        direct = self._gradient_direct(step)

        def run(inputs, env):
            y = env.get(y_name)
            if y is None:  # y not computed yet: re-evaluate the sub-graph
                return self._run_gradient(step, inputs, env)
            return direct(inputs[:nx], inputs[nx:], y)
        return run

    def _gradient_direct(self, step):
        """``run(xs, zs, y)``: the Gradient node's outputs when ``y`` was computed from these
        very ``xs`` and ``zs`` in this pass (its forward pass is on the tape): one backward walk.
        What ``_differentiate`` does, with the node's constants bound once."""
        xs_names, y_name = step.xs, step.y
        retain, create = self.retain_graph, step.differentiated
        gradient, ones_like = ad.gradient, np.ones_like

        def run(xs, zs, y):
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
        return run

    def _differentiate(self, step, y, xs, zs):
        """The Gradient node's outputs: ``d y / d xs`` (zeros where y does not depend on x).
        ``autodiff.gradient`` itself records the walk exactly when ``create_graph`` is on."""
        if y.data.dtype.kind != "f":
            raise TypeError(f"y '{step.y}': expected a floating-point tensor, got {y.data.dtype}")
        seed = None if y.data.size == 1 else np.ones_like(y.data)
        for z in zs:
            if z._node is not None or z.requires_grad:
                break
        else:  # no z is on the tape (feeds, constants): stopping at them changes nothing
            zs = ()
        grads = ad.gradient(y, xs, zs, grad_output=seed, retain_graph=self.retain_graph,
                            create_graph=step.differentiated, allow_unused=True)
        return _dense_gradients(xs, grads)

    def _run_gradient(self, step, inputs, env):
        nx = len(step.xs)
        names = step.xs + step.zs
        y = env.get(step.y)
        reuse = y is not None and all(env.get(n) is t for n, t in zip(names, inputs))
        if reuse:
            xs, zs = inputs[:nx], inputs[nx:]
        else:
            sub = {}
            for n, t in zip(names, inputs):
                if n in step.xs and not t.requires_grad and t.data.dtype.kind == "f":
                    t = Tensor(t.data, requires_grad=True)
                sub[n] = t
            self._execute(sub, step.subgraph)
            y = sub[step.y]
            xs, zs = [sub[n] for n in step.xs], [sub[n] for n in step.zs]
        for n, x in zip(step.xs, xs):
            if x.data.dtype.kind != "f":
                raise TypeError(f"xs '{n}': expected a floating-point tensor, got {x.data.dtype}")
        return self._differentiate(step, y, xs, zs)
