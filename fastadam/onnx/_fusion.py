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

Only programs that know what the caller reads after them (``keep``) are fused: the session's
steps.  ``fastadam.onnx.run`` and a Gradient node's re-evaluated sub-graph may be asked for any
tensor, so they run every node.
"""
import copy

import numpy as np

from .. import autodiff as ad
from ._budget import reserve

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
