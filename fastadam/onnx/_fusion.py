"""Node patterns a ``Program`` runs as one autodiff operation.

Attention.  Exported transformers compute attention as four nodes::

    scores = MatMul(q, kt);  masked = Add(scores, mask)  (or Add(mask, scores))
    probs = Softmax(masked, axis=-1);  out = MatMul(probs, v)

often with ``q`` and ``kt`` each a ``Mul`` by a one-element scale first (PyTorch's exporters
write ``scaled_dot_product_attention`` so: ``q * sqrt(scale)`` and ``kt * sqrt(scale)``).  A
program whose ``scores``, ``masked`` and ``probs`` (and the scaled ``q`` and ``kt``) are each
read by the next of these nodes only (no other node, no Gradient node's ``xs``, ``zs`` or
``y``, nothing the caller keeps) runs them as one step at the last MatMul's place:
``fastadam.autodiff.attention(q, kt, v, mask, scale)``, whose fused kernel never forms the
scores in memory and skips the masked tail of each row.  The step decides at each run: where
``attention_fuses`` says the kernel does not take the operands (another dtype, broadcasting
batch axes, another mask shape), or a scale is not a one-element float32 constant (one that
needs a gradient, say), it runs the nodes as they are, each error labelled with its own node.
The values differ from the unfused nodes' by rounding only: the products sum in another order,
and the two scales multiply the scores (``sq * sk * (q @ kt)``) instead of their operands.

Linear layers.  ``MatMul(x, w)`` whose product only an ``Add`` reads (``Add(product, bias)``
or ``Add(bias, product)``), the form both of PyTorch's exporters give ``nn.Linear`` on inputs
of rank 3, runs as ``fastadam.autodiff.matmul_add(x, w, bias)`` when at run time ``w`` is
2-D, ``bias`` 1-D of ``w``'s columns and the three of one floating dtype: the bias is added
into the product's own buffer and the tape records one operation instead of two, with the
bits of the two nodes (values and gradients).  Otherwise the two nodes run.  Attention
patterns are found first and keep their MatMul and Add.

Training a multi-layer perceptron.  A Gradient node of ``y`` in ``xs`` whose sub-graph is a
chain ``Gemm`` (``transB=1``, ``alpha = beta = 1``, a bias ``C``) [``Relu``] ... ``Gemm``
feeding a ``SoftmaxCrossEntropyLoss`` (``reduction="mean"``, no weights) whose output is
``y``, each ``xs`` a weight or bias of those Gemms, each intermediate read by the next node
only and ``y`` by the Gradient node only (and the caller), and no other Gradient node in the
graph, runs with the nodes of the chain as one step at the Gradient node's place:
``fastadam.autodiff.mlp_loss_and_gradients``, the forward pass and the backward walk without a
tape, with the bits of the nodes (values and gradients).  Outputs: the loss, then the
Gradient node's.  The step decides at each run: where ``mlp_fuses`` says the function does
not take the operands (another dtype in one of them, a bias to broadcast, ...) or a label
equals the loss's ``ignore_index``, it runs the nodes as they are, then the backward walk.
The Gemm nodes' outputs are budgeted as the nodes budget them, and a label out of range is
the loss node's error.

Only programs that know what the caller reads after them (``keep``) are fused: the session's
steps.  ``fastadam.onnx.run`` and a Gradient node's re-evaluated sub-graph may be asked for any
tensor, so they run every node.
"""
import copy

import numpy as np

from .. import autodiff as ad
from ._budget import MemoryBudgetError, reserve

_CORE = ("", "ai.onnx")


def _is(step, op_type, n_inputs):
    return (step.kind == "core" and step.node.op_type == op_type and step.node.domain in _CORE
            and len(step.inputs) == n_inputs and all(step.inputs) and len(step.outputs) == 1)


def fuse(graph, steps, keep, errors):
    """``steps`` (of ``graph``, in order) with every fusable attention pattern replaced by one
    step; ``keep``: the names read after the program; ``errors``: the exceptions a node's
    error is re-raised as, with the node's label in front (``graph.relabel``)."""
    readers = {}
    for s in steps:
        names = list(s.inputs)
        if s.kind == "gradient":
            names += [s.y, *s.xs, *s.zs, *s.constants]
        for n in names:
            readers[n] = readers.get(n, 0) + 1
    producer = {n: s for s in steps for n in s.outputs if n}

    def only_read_by_next(name):
        return readers.get(name) == 1 and name not in keep and name not in graph.grad_names

    steps = _fuse_mlp_training(graph, steps, keep, readers, producer, only_read_by_next, errors)
    fused, dropped = {}, set()
    taken = lambda s: id(s) in dropped or id(s) in fused  # noqa: E731
    for s4 in steps:
        if not _is(s4, "MatMul", 2):
            continue
        s3 = producer.get(s4.inputs[0])
        if s3 is None or not _is(s3, "Softmax", 1) or s3.attrs.get("axis") != -1:
            continue
        s2 = producer.get(s3.inputs[0])
        if s2 is None or not _is(s2, "Add", 2):
            continue
        for pos in (0, 1):
            # (an s1 that is another pattern's last MatMul stays that pattern's)
            s1 = producer.get(s2.inputs[pos])
            if s1 is not None and _is(s1, "MatMul", 2) and not taken(s1):
                break
        else:
            continue
        if taken(s2) or taken(s3) or not all(
                only_read_by_next(n) for n in (s1.outputs[0], s2.outputs[0], s3.outputs[0])):
            continue
        # a Mul of q or of kt read by s1 alone: folded as a scale when it is one at run time
        scales = []
        for name in s1.inputs:
            mul = producer.get(name)
            scales.append(mul if mul is not None and _is(mul, "Mul", 2) and not taken(mul)
                          and only_read_by_next(name) else None)
        fused[id(s4)] = _attention_step(graph, errors, s1, s2, s3, s4, scales,
                                        mask=s2.inputs[1 - pos], scores_first=pos == 0)
        dropped.update(id(s) for s in (s1, s2, s3, *scales) if s is not None)
    if fused:
        steps = [fused.get(id(s), s) for s in steps if id(s) not in dropped]
    return _fuse_linear(graph, steps, only_read_by_next, producer, errors)


def _fuse_linear(graph, steps, only_read_by_next, producer, errors):
    """``steps`` with each ``MatMul(x, w)`` whose product only an ``Add`` of a bias reads
    replaced by one step (after the attention patterns, which keep their MatMul and Add)."""
    fused, dropped = {}, set()
    present = {id(s) for s in steps}  # (a MatMul of a fused attention is not)
    for s2 in steps:
        if not _is(s2, "Add", 2):
            continue
        for pos in (0, 1):
            s1 = producer.get(s2.inputs[pos])
            if s1 is not None and id(s1) in present and _is(s1, "MatMul", 2) and \
                    id(s1) not in dropped and only_read_by_next(s1.outputs[0]):
                break
        else:
            continue
        fused[id(s2)] = _linear_step(graph, errors, s1, s2, bias=s2.inputs[1 - pos],
                                     product_first=pos == 0)
        dropped.add(id(s1))
    if not fused:
        return steps
    return [fused.get(id(s), s) for s in steps if id(s) not in dropped]


def _call(graph, errors, s, args):
    """``s.run(args)``, an error labelled with ``s``'s node."""
    try:
        return s.run(list(args))
    except errors as e:
        labelled = graph.relabel(s, e)
        if labelled is e:
            raise
        raise labelled from e


def _linear_step(graph, errors, s1, s2, bias, product_first):
    """The step that runs ``s1`` (``MatMul(x, w)``) and ``s2`` (its product plus ``bias``) as
    ``fastadam.autodiff.matmul_add(x, w, bias)`` when at run time ``w`` is 2-D, ``bias``
    1-D of ``w``'s columns and all three of one floating dtype (the same values as the two
    nodes); otherwise as the two nodes."""
    def run(inputs):
        x, w, c = inputs
        xd, wd, cd = x.data, w.data, c.data
        if (wd.ndim == 2 and cd.ndim == 1 and xd.ndim >= 2 and xd.shape[-1] == wd.shape[0]
                and cd.shape[0] == wd.shape[1] and xd.dtype == wd.dtype == cd.dtype
                and xd.dtype.kind == "f"):
            reserve("MatMul", xd.shape[:-1] + wd.shape[1:], xd.dtype)
            return [ad.matmul_add(x, w, c)]
        y = _call(graph, errors, s1, (x, w))[0]
        return _call(graph, errors, s2, (y, c) if product_first else (c, y))

    step = copy.copy(s2)
    step.label = f"{s2.label} (fused with {s1.label})"
    step.inputs = list(s1.inputs) + [bias]
    step.outputs = list(s2.outputs)
    step.attrs = {}
    step.run = run
    return step


def _scaled(pair):
    """``(operand, scale)`` of a Mul's two inputs when one of them is a one-element float32
    constant (no gradient) and the other the operand; None otherwise."""
    a, b = pair
    for x, c in ((a, b), (b, a)):
        cd, xd = c.data, x.data
        if cd.size == 1 and xd.size != 1 and cd.dtype == xd.dtype == np.float32 and \
                cd.ndim <= xd.ndim and c._node is None and not c.requires_grad:
            return x, float(cd.reshape(()))
    return None


def _attention_step(graph, errors, s1, s2, s3, s4, scales, mask, scores_first):
    """The step that runs the nodes ``scales`` (the Muls of q and kt, or None), ``s1 .. s4``
    as one (see the module note): a copy of ``s4`` with the inputs of all and its own
    ``run``."""
    def call(s, args):
        return _call(graph, errors, s, args)

    widths = [1 if mul is None else 2 for mul in scales]  # inputs per operand of s1

    def operands(inputs):
        """The q and kt parts of ``inputs``, as the Muls (if any) read them."""
        return [inputs[:widths[0]], inputs[widths[0]:widths[0] + widths[1]]]

    def unfused(inputs):
        parts, (m, v) = operands(inputs), inputs[-2:]
        qk = [p[0] if mul is None else call(mul, p)[0] for mul, p in zip(scales, parts)]
        scores = call(s1, qk)[0]
        masked = call(s2, (scores, m) if scores_first else (m, scores))[0]
        return call(s4, (call(s3, (masked,))[0], v))

    def run(inputs):
        (qp, kp), (m, v) = operands(inputs), inputs[-2:]
        scale, qk = 1.0, []
        for mul, p in zip(scales, (qp, kp)):
            if mul is None:
                qk.append(p[0])
                continue
            found = _scaled(p)
            if found is None:
                return unfused(inputs)
            qk.append(found[0])
            scale *= found[1]
        q, kt = qk
        if ad.attention_fuses(q.data, kt.data, v.data, m.data):
            reserve("MatMul", q.shape[:-1] + v.shape[-1:], np.dtype(np.float32))
            return [ad.attention(q, kt, v, m, scale=scale)]
        return unfused(inputs)

    step = copy.copy(s4)
    nodes = [mul for mul in scales if mul is not None] + [s1, s2, s3]
    step.label = f"{s4.label} (fused with {', '.join(s.label for s in nodes)})"
    step.inputs = [n for mul, name in zip(scales, s1.inputs)
                   for n in ([name] if mul is None else mul.inputs)] + [mask, s4.inputs[1]]
    step.outputs = list(s4.outputs)
    step.attrs = {}
    step.run = run
    return step


def _is_linear(step):
    """A Gemm of a linear layer: ``A @ B.T + C`` (transB=1, alpha = beta = 1, a bias)."""
    a = step.attrs
    return _is(step, "Gemm", 3) and not a.get("transA", 0) and a.get("transB", 0) == 1 and \
        a.get("alpha", 1.0) == 1.0 and a.get("beta", 1.0) == 1.0


def _mlp_chain(grad, producer, present, only_read_by_next):
    """``(layers, loss_step, x)`` of a Gradient node that trains an MLP (see the module
    note): ``layers`` the (Gemm, Relu or None) pairs from the input up, ``x`` the chain's
    input name; None when ``grad`` is not one."""
    loss = producer.get(grad.y)
    if loss is None or id(loss) not in present or not _is(loss, "SoftmaxCrossEntropyLoss", 2) \
            or loss.attrs.get("reduction", "mean") != "mean":
        return None
    layers, name, relu = [], loss.inputs[0], None
    while True:
        s = producer.get(name)
        if s is None or id(s) not in present or not only_read_by_next(name):
            break
        if _is_linear(s):
            layers.append((s, relu))
            relu = None
        elif _is(s, "Relu", 1) and relu is None and layers:
            relu = s
        else:
            break
        name = s.inputs[0]
    if not layers or relu is not None:  # (a Relu on the input: not a layer's)
        return None
    layers.reverse()
    params = [n for gemm, _ in layers for n in gemm.inputs[1:]]
    nodes = [s for pair in layers for s in pair if s is not None] + [loss]
    # distinct parameters, input and labels; gradients of parameters only; the sub-graph is
    # the chain and the loss, nothing else
    if len({*params, name, loss.inputs[1]}) != len(params) + 2 or \
            not set(grad.xs) <= set(params) or \
            sorted(grad.subgraph) != sorted(s.index for s in nodes):
        return None
    return layers, loss, name


def _fuse_mlp_training(graph, steps, keep, readers, producer, only_read_by_next, errors):
    """``steps`` with each Gradient node that trains an MLP (see the module note) and the
    nodes of its chain replaced by one step."""
    if graph.retain_graph:  # another Gradient node walks the same tape
        return steps
    present = {id(s) for s in steps}
    fused, dropped = {}, set()
    for grad in steps:
        if grad.kind != "gradient" or grad.differentiated or grad.inputs != grad.xs + grad.zs \
                or any(n in graph.grad_names for n in grad.outputs) or \
                readers.get(grad.y) != 1 or grad.y in graph.grad_names:
            continue
        found = _mlp_chain(grad, producer, present, only_read_by_next)
        if found is None:
            continue
        layers, loss, x = found
        fused[id(grad)] = _mlp_step(graph, errors, grad, layers, loss, x)
        dropped.update(id(s) for gemm, relu in layers for s in (gemm, relu, loss)
                       if s is not None)
    if not fused:
        return steps
    return [fused.get(id(s), s) for s in steps if id(s) not in dropped]


def _mlp_step(graph, errors, grad, layers, loss, x):
    """The step that runs ``layers`` (Gemm, Relu or None), ``loss`` and the Gradient node
    ``grad`` as ``fastadam.autodiff.mlp_loss_and_gradients`` when it takes the operands at run
    time, else as the nodes (see the module note).  Inputs: ``x``, the labels, then each
    layer's weight and bias; outputs: the loss, then ``grad``'s."""
    params = [n for gemm, _ in layers for n in gemm.inputs[1:]]
    need = tuple(n in grad.xs for n in params)
    order = [params.index(n) for n in grad.xs]  # the gradient of grad.xs[j]
    relu = tuple(r is not None for _, r in layers[:-1])
    ignore = loss.attrs.get("ignore_index")
    gemms = [gemm for gemm, _ in layers]
    nodes = [s for gemm, relu_step in layers for s in (gemm, relu_step) if s is not None]
    differentiate = graph._differentiation(grad)
    position = {n: i for i, n in enumerate([x, loss.inputs[1], *params])}
    xs_at = [position[n] for n in grad.xs]
    zs_at = [position.get(n) for n in grad.zs]  # (a z outside the chain's inputs: a constant)

    def unfused(inputs):
        env = dict(zip([x, loss.inputs[1], *params], inputs))
        for s in nodes + [loss]:
            env[s.outputs[0]] = _call(graph, errors, s, [env[n] for n in s.inputs])[0]
        y = env[loss.outputs[0]]
        try:
            grads = differentiate(y, [inputs[i] for i in xs_at],
                                  [inputs[i] for i in zs_at if i is not None])
        except errors as e:
            raise graph.relabel(grad, e) from e
        return [y, *grads]

    def run(inputs):
        arrays = [t.data for t in inputs]
        xd, labels = arrays[0], arrays[1]
        ws, bs = arrays[2::2], arrays[3::2]
        if not ad.mlp_fuses(xd, ws, bs, labels) or (
                ignore is not None and bool(np.any(labels == ignore))):
            return unfused(inputs)
        rows, dtype = xd.shape[0], xd.dtype
        for gemm, w in zip(gemms, ws):  # each Gemm node's output, as the node budgets it
            try:
                reserve("Gemm", (rows, w.shape[0]), dtype)
            except MemoryBudgetError as e:
                raise graph.relabel(gemm, e) from e
        try:
            value, grads = ad.mlp_loss_and_gradients(xd, ws, bs, labels, relu, need)
        except IndexError as e:  # a label out of range: the loss node's error
            raise graph.relabel(loss, e) from e
        return [value, *[grads[i] for i in order]]

    step = copy.copy(loss)
    step.index = grad.index
    step.label = f"{grad.label} (fused with {', '.join(s.label for s in nodes + [loss])})"
    step.inputs = [x, loss.inputs[1], *params]
    step.outputs = [loss.outputs[0], *grad.outputs]
    step.attrs = {}
    step.run = run
    return step
