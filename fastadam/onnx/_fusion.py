"""Node patterns a ``Program`` runs as one autodiff operation.

Attention.  Exported transformers compute attention as four nodes::

    scores = MatMul(q, kt);  masked = Add(scores, mask)  (or Add(mask, scores))
    probs = Softmax(masked, axis=-1);  out = MatMul(probs, v)

A program whose ``scores``, ``masked`` and ``probs`` are each read by the next of these nodes
only (no other node, no Gradient node's ``xs``, ``zs`` or ``y``, nothing the caller keeps)
runs them as one step at the last MatMul's place: ``fastadam.autodiff.attention(q, kt, v,
mask)``, whose fused kernel never forms the scores in memory and skips the masked tail of each
row.  The step decides at each run: where ``attention_fuses`` says the kernel does not take the
operands (another dtype, broadcasting batch axes, another mask shape), it runs the four nodes
as they are, each error labelled with its own node.  The values differ from the unfused nodes'
by the order of the sums in the products only (the softmax is the same code).

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
            s1 = producer.get(s2.inputs[pos])
            # (an s1 that is another pattern's last MatMul stays that pattern's)
            if s1 is not None and _is(s1, "MatMul", 2) and id(s1) not in fused:
                break
        else:
            continue
        if not all(only_read_by_next(n) for n in (s1.outputs[0], s2.outputs[0],
                                                   s3.outputs[0])):
            continue
        if {id(s1), id(s2), id(s3)} & dropped:
            continue
        fused[id(s4)] = _attention_step(graph, errors, s1, s2, s3, s4,
                                        mask=s2.inputs[1 - pos], scores_first=pos == 0)
        dropped.update((id(s1), id(s2), id(s3)))
    if not fused:
        return steps
    return [fused.get(id(s), s) for s in steps if id(s) not in dropped]


def _attention_step(graph, errors, s1, s2, s3, s4, mask, scores_first):
    """The step that runs the four nodes ``s1 .. s4`` as one (see the module note): a copy of
    ``s4`` with the inputs of the four and its own ``run``."""
    parts = (s1, s2, s3, s4)

    def unfused(q, kt, m, v):
        x = q, kt
        for s in parts:
            try:
                x = s.run(list(x))
            except errors as e:
                labelled = graph.relabel(s, e)
                if labelled is e:
                    raise
                raise labelled from e
            if s is s1:
                x = (x[0], m) if scores_first else (m, x[0])
            elif s is s3:
                x = (x[0], v)
        return x

    def run(inputs):
        q, kt, m, v = inputs
        if ad.attention_fuses(q.data, kt.data, v.data, m.data):
            reserve("MatMul", q.shape[:-1] + v.shape[-1:], np.dtype(np.float32))
            return [ad.attention(q, kt, v, m)]
        return unfused(q, kt, m, v)

    step = copy.copy(s4)
    step.label = f"{s4.label} (fused with {s1.label}, {s2.label}, {s3.label})"
    step.inputs = [s1.inputs[0], s1.inputs[1], mask, s4.inputs[1]]
    step.outputs = list(s4.outputs)
    step.attrs = {}
    step.run = run
    return step
