"""``make_training_model``: add a training algorithm to an inference model.

The result is the input model plus one ``TrainingInfoProto``:

- ``algorithm``: a loss on the chosen output, ``Gradient(xs=params, zs=everything else the loss
  reads, y=loss)``, ``T_next = T + 1`` and one optimizer node over all parameters; outputs the
  loss, the new parameters, the new optimizer states and ``T_next``;
- ``update_binding``: each parameter, state and ``T`` gets its new value;
- ``initialization`` (with ``initialization_binding``): zeros for the optimizer states and ``T``.

The optimizer's ``T`` input: Adam gets ``T_next`` (1 at the first step, so the bias correction
starts as PyTorch's and TensorFlow's do); Adagrad and Momentum get ``T`` (0 at the first step:
Adagrad's ``R / (1 + T * decay_factor)`` and Momentum's undampened first step then match
``torch.optim.Adagrad`` and ``torch.optim.SGD``).  Every added name starts with ``fastadam.``.

What the exporters do to parameters (``tied_initializers="restore"``, the default, undoes
both; ``"keep"`` trains the initializers as they are).  A parameter torch ties on purpose is a
single ``Parameter`` used in several places; the graph cannot always tell it from what an
exporter did, so the rules read how an initializer is consumed.

1. Merges (``_untie_merged``).  torch's exporters (TorchScript and dynamo) write one
   initializer for parameters of equal values, so distinct parameters that start equal (fresh
   LayerNorms: all ones, all zeros) reach the model as one initializer feeding several layers,
   directly or through ``Identity`` nodes.  A trained initializer is untied, one copy per use,
   when every use (``Identity`` nodes followed to the nodes behind them) is a layer's parameter
   input -- LayerNormalization / BatchNormalization / InstanceNormalization /
   GroupNormalization scale and bias, RMSNormalization scale, MatMul's right operand, Gemm's B
   and C, Conv / ConvTranspose weight and bias, an Add of a bias to a MatMul's, Gemm's or
   Conv's result -- and there are at least two.  Anything else stays one tensor: a weight that
   a Gather also reads (an embedding tied to the output head, an embedding shared by an encoder
   and a decoder) keeps its tie, as torch trains it, with the gradients of its uses summed.
   Parameters that torch shares by applying one module several times (cross-layer sharing)
   look like a merge: ``"keep"`` trains them as one.  The first reader keeps the initializer;
   a copy is named after the ``Identity`` output it replaces (TorchScript writes one per torch
   parameter, under its name), else ``fastadam.untied.<node>.<scale|weight|bias>``.
2. Folded heads (``_retie_folded_heads``).  With constant folding (both exporters' default) a
   head tied to its embedding ``E`` is written as a second initializer holding ``E.T``.  A
   trained 2-D initializer that only MatMul (right operand) or Gemm (B, ``transB=0``) read and
   that equals the transpose of a trained initializer a Gather reads becomes the output of
   ``Transpose(E)`` (a node ``fastadam.tie.<head>``): one tensor, as torch trains it.
"""
import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ._graph import TRAINING_DOMAIN
from ._model import load_model, opsets

_PREFIX = "fastadam."
_STATES = {"adam": ("V", "H"), "adagrad": ("H",), "momentum": ("V",)}
_TIED = ("restore", "keep")
# (op_type, input index) -> what the input is, for the inputs that hold a layer's parameter
_LAYER_INPUTS = {("LayerNormalization", 1): "scale", ("LayerNormalization", 2): "bias",
                 ("BatchNormalization", 1): "scale", ("BatchNormalization", 2): "bias",
                 ("InstanceNormalization", 1): "scale", ("InstanceNormalization", 2): "bias",
                 ("GroupNormalization", 1): "scale", ("GroupNormalization", 2): "bias",
                 ("RMSNormalization", 1): "scale",
                 ("MatMul", 1): "weight", ("Gemm", 1): "weight", ("Gemm", 2): "bias",
                 ("Conv", 1): "weight", ("Conv", 2): "bias",
                 ("ConvTranspose", 1): "weight", ("ConvTranspose", 2): "bias"}
_BIASED = ("MatMul", "Gemm", "Conv")  # an Add of an initializer to their result adds a bias


def _sources(nodes, target, stop=()):
    """Names that ``target`` depends on and no node produces (inputs, initializers)."""
    producer = {o: n for n in nodes for o in n.output if o}
    seen, found, stack = set(), [], [target]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is None:
            found.append(name)
        else:
            stack.extend(i for i in node.input if i)
    return found


def _subgraph_names(nodes):
    """Every name that a sub-graph (an If / Loop / Scan body) of ``nodes`` reads."""
    names, stack = set(), [a for n in nodes for a in n.attribute]
    while stack:
        a = stack.pop()
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in g.node:
                names.update(n.input)
                stack.extend(n.attribute)
    return names


def _layer_input(node, index, producer):
    """What input ``index`` of ``node`` holds ("scale", "weight", "bias"), when it is a layer's
    parameter; else None."""
    if node.domain not in ("", "ai.onnx"):
        return None
    kind = _LAYER_INPUTS.get((node.op_type, index))
    if kind is None and node.op_type == "Add" and len(node.input) == 2:
        other = producer.get(node.input[1 - index])
        if other is not None and other.op_type in _BIASED and other.domain in ("", "ai.onnx"):
            kind = "bias"
    return kind


def _untie_merged(graph, params):
    """Give each layer that reads a merged initializer a copy of its own (the module note's
    rule), in place on ``graph``.  Returns the parameters (each untied one replaced by its copies,
    in node order) and ``{untied initializer: [(node name, op_type, input kind), ...]}``."""
    nodes = list(graph.node)
    consumers = {}
    for k, n in enumerate(nodes):
        for i, x in enumerate(n.input):
            if x:
                consumers.setdefault(x, []).append((k, i))
    producer = {o: n for n in nodes for o in n.output if o}
    fixed = ({o.name for o in graph.output} | {i.name for i in graph.input}
             | _subgraph_names(nodes))
    inits = {t.name: t for t in graph.initializer}
    taken = set(inits) | set(producer) | {i.name for i in graph.input} | set(consumers)

    def layer_uses(name):
        """``(uses, identities)``: the (node, input) pairs behind ``Identity`` nodes that read
        ``name`` and those Identity nodes; ``uses`` is None when one is not a layer's input."""
        uses, identities, stack = [], [], [name]
        while stack:
            for k, i in consumers.get(stack.pop(), ()):
                n = nodes[k]
                if (n.op_type == "Identity" and n.domain in ("", "ai.onnx")
                        and n.output[0] not in fixed):
                    identities.append(k)
                    stack.append(n.output[0])
                elif _layer_input(n, i, producer) is None:
                    return None, ()
                else:
                    uses.append((k, i))
        return sorted(uses), identities

    out, untied, dropped, added = [], {}, set(), []
    for p in params:
        uses, identities = layer_uses(p) if p in inits and p not in fixed else (None, ())
        if uses is None or len(uses) < 2:
            out.append(p)
            continue
        names = set()
        for k, i in uses:
            name = nodes[k].input[i]  # ``p`` or an Identity's output: the first use keeps it
            if name in names:
                base = (f"{_PREFIX}untied.{nodes[k].name or f'node{k}'}."
                        f"{_layer_input(nodes[k], i, producer)}")
                name, count = base, 1
                while name in taken:
                    count += 1
                    name = f"{base}.{count}"
                nodes[k].input[i] = name
            names.add(name)
            taken.add(name)
            out.append(name)
            if name != p:
                copy = onnx.TensorProto()
                copy.CopyFrom(inits[p])
                copy.name = name
                added.append(copy)
        dropped.update(identities)
        if p not in names:
            del inits[p]  # every reader has a copy of its own
        untied[p] = [(nodes[k].name, nodes[k].op_type, _layer_input(nodes[k], i, producer))
                     for k, i in uses]
    if untied:
        _replace(graph.node, [n for k, n in enumerate(nodes) if k not in dropped])
        _replace(graph.initializer, list(inits.values()) + added)
    return out, untied


def _replace(field, items):
    """Set a repeated message field of a graph to ``items`` (copied first: some of them are
    its own elements)."""
    copies = [type(m)() for m in items]
    for copy, m in zip(copies, items):
        copy.CopyFrom(m)
    del field[:]
    field.extend(copies)


def _retie_folded_heads(graph, params, arrays):
    """Tie back an output head that an exporter folded into an initializer of its own (the
    module note), in place on ``graph``: the head initializer ``H`` becomes the output of
    ``Transpose(E)``.  Returns the parameters without the heads and ``{H: E}``."""
    nodes = list(graph.node)
    readers = {}
    for n in nodes:
        for i, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, i))
    fixed = ({o.name for o in graph.output} | {i.name for i in graph.input}
             | _subgraph_names(nodes))

    def core(n):
        return n.domain in ("", "ai.onnx")

    def head_use(n, i):
        trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
        return core(n) and i == 1 and (n.op_type == "MatMul" or (n.op_type == "Gemm"
                                                                 and not trans_b))
    embeddings = [p for p in params if p not in fixed and arrays[p].ndim == 2
                  and any(core(n) and n.op_type == "Gather" and i == 0
                          for n, i in readers.get(p, ()))]
    tied = {}
    for h in params:
        a = arrays[h]
        if h in fixed or h in embeddings or a.ndim != 2 or not readers.get(h) or \
                not all(head_use(n, i) for n, i in readers[h]):
            continue
        e = next((e for e in embeddings if arrays[e].dtype == a.dtype
                  and arrays[e].shape == a.shape[::-1] and np.array_equal(arrays[e].T, a)), None)
        if e is not None:
            tied[h] = e
    if tied:
        _replace(graph.initializer, [t for t in graph.initializer if t.name not in tied])
        transposes = [helper.make_node("Transpose", [e], [h], name=f"{_PREFIX}tie.{h}",
                                       perm=[1, 0]) for h, e in tied.items()]
        _replace(graph.node, transposes + nodes)  # E is an initializer: the Transposes go first
    return [p for p in params if p not in tied], tied


def _restore_warning(untied, tied):
    """The one warning that says what ``tied_initializers="restore"`` changed."""
    parts = []
    if untied:
        names = []
        for p, uses in untied.items():
            kinds = " / ".join(sorted({f"{op} {kind}" for _, op, kind in uses}))
            nodes = ", ".join(repr(n) for n, _, _ in uses[:3]) + (", ..." if len(uses) > 3
                                                                 else "")
            names.append(f"'{p}' ({len(uses)} uses: {kinds} of nodes {nodes})")
        copies = sum(len(u) for u in untied.values())
        parts.append(f"{len(untied)} initializer(s) feed several layers, as an exporter writes "
                     f"parameters of equal initial values (fresh LayerNorms) merged into one: "
                     f"{'; '.join(names)}; each layer now trains a copy of its own ({copies} "
                     f"tensors instead of {len(untied)})")
    if tied:
        heads = ", ".join(f"'{h}' = Transpose('{e}')" for h, e in tied.items())
        parts.append(f"{len(tied)} output head(s) equal an embedding's transpose, as an "
                     f"exporter folds a head tied to its embedding: {heads} now trains as that "
                     f"embedding (one tensor, both gradients summed)")
    return (f"make_training_model: {'. '.join(parts)}. This trains the source model's "
            f"parameters; pass tied_initializers='keep' to train the initializers as they are.")


def _loss_nodes(kind, output, labels, core_opset):
    loss = _PREFIX + "loss"
    if kind == "softmax_cross_entropy":
        if core_opset < 12:
            raise ValueError(f"loss: SoftmaxCrossEntropyLoss needs ai.onnx opset 12 or newer, the "
                             f"model imports opset {core_opset}")
        return loss, [helper.make_node("SoftmaxCrossEntropyLoss", [output, labels], [loss],
                                       name=_PREFIX + "loss", reduction="mean")]
    if kind == "mse":
        diff, sq = _PREFIX + "diff", _PREFIX + "sq"
        return loss, [helper.make_node("Sub", [output, labels], [diff], name=_PREFIX + "sub"),
                      helper.make_node("Mul", [diff, diff], [sq], name=_PREFIX + "square"),
                      helper.make_node("ReduceMean", [sq], [loss], name=_PREFIX + "mean",
                                       keepdims=0)]
    raise ValueError(f"loss: expected 'softmax_cross_entropy', 'mse' or the name of an output "
                     f"of the model, got {kind!r}")


def make_training_model(inference_model, *, loss="softmax_cross_entropy", output=None,
                        labels="labels", optimizer="adam", lr=1e-3, params=None,
                        tied_initializers="restore", **optimizer_attrs):
    """A copy of ``inference_model`` with a ``training_info`` that trains it.

    Parameters
    ----------
    inference_model : ModelProto or path
    loss : str
        ``"softmax_cross_entropy"`` (mean over the batch, integer labels of shape (N,)),
        ``"mse"`` (mean squared error, float labels of the output's shape), or the name of an
        output of the model that already is a scalar loss (then no labels input is added).
    output : str, optional
        The model output the loss is computed on (default: the first output).
    labels : str
        Name of the labels input of the algorithm graph.
    optimizer : {"adam", "adagrad", "momentum"}
    lr : float
        The learning rate ``R``.
    params : list of str, optional
        Initializers to train.  Default: every floating-point initializer of more than one
        element that the loss depends on.  One-element initializers are left out: exporters
        store constants there (torch's dynamo exporter writes an attention's scale, its mask's
        fill value and the 0 its causal mask is compared with as one-element initializers), and
        training them changes the model (a scale that drifts, a mask that no longer masks).
        Name a one-element parameter (a PReLU slope) here to train it.
    tied_initializers : {"restore", "keep"}
        ``"restore"`` (default): train the source model's parameters where an exporter merged
        or split them, with one ``UserWarning`` saying what changed.  torch's exporters write
        one initializer for parameters of equal values (fresh LayerNorms: all ones, all zeros):
        an initializer that several layers read as their parameter (a normalization's scale or
        bias, a MatMul / Gemm / Conv weight, a bias added to their result; directly or through
        ``Identity`` nodes) is untied, each layer training a copy of its own (named after the
        ``Identity`` output it replaces, else ``fastadam.untied.<node>.<scale|weight|bias>``).
        A weight that a Gather also reads (an embedding tied to the output head) keeps its tie:
        one tensor, gradients of its uses summed, as torch trains a tied ``Parameter``; and a
        head that constant folding wrote as the embedding's transpose is tied back to it.
        ``"keep"``: train the initializers as they are (a module that torch applies several
        times, sharing its parameters on purpose, exports like a merge).
    **optimizer_attrs
        Attributes of the optimizer node (Adam: alpha, beta, epsilon, norm_coefficient,
        norm_coefficient_post; Adagrad: decay_factor, epsilon, norm_coefficient; Momentum:
        alpha, beta, mode, norm_coefficient, all required by the operator).
    """
    src = load_model(inference_model)
    if tied_initializers not in _TIED:
        raise ValueError(f"tied_initializers: expected 'restore' or 'keep', got "
                         f"{tied_initializers!r}")
    if optimizer not in _STATES:
        raise ValueError(f"optimizer: expected 'adam', 'adagrad' or 'momentum', got "
                         f"{optimizer!r}")
    model = onnx.ModelProto()
    model.CopyFrom(src)
    graph = model.graph
    ops = opsets(model)
    core = ops.get("", ops.get("ai.onnx", 0))
    outputs = {o.name: o for o in graph.output}
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}

    alg_inputs, nodes = [], []
    if loss in outputs:
        loss_name = loss
    else:
        output = output or graph.output[0].name
        if output not in outputs:
            raise ValueError(f"output: '{output}' is not an output of the model")
        elem = outputs[output].type.tensor_type.elem_type
        if loss == "softmax_cross_entropy":
            alg_inputs.append(helper.make_tensor_value_info(labels, onnx.TensorProto.INT64,
                                                            ["N"]))
        elif loss == "mse":
            alg_inputs.append(helper.make_tensor_value_info(labels, elem, None))
        loss_name, nodes = _loss_nodes(loss, output, labels, core)

    reached = _sources(list(graph.node) + nodes, loss_name)
    if params is None:
        params = [n for n in reached if n in inits and inits[n].dtype.kind == "f"
                  and inits[n].size > 1]
    params = list(params)
    for p in params:
        if p not in inits:
            raise ValueError(f"params: '{p}' is not an initializer of the model")
        if inits[p].dtype.kind != "f":
            raise TypeError(f"params: '{p}' has dtype {inits[p].dtype}; only floating-point "
                            f"initializers can be trained")
        if p not in reached:
            raise ValueError(f"params: the loss does not depend on '{p}'")
    if not params:
        raise ValueError("params: the loss depends on no floating-point initializer to train")
    if tied_initializers == "restore":
        params, tied = _retie_folded_heads(graph, params, inits)
        params, untied = _untie_merged(graph, params)
        if untied or tied:
            warnings.warn(_restore_warning(untied, tied), UserWarning, stacklevel=2)
            inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
            reached = _sources(list(graph.node) + nodes, loss_name)
    zs = [n for n in reached if n not in params]

    dtype = inits[params[0]].dtype
    R, T, one, T_next = (_PREFIX + s for s in ("R", "T", "one", "T_next"))
    grads = [_PREFIX + "grad." + p for p in params]
    nodes.append(helper.make_node("Gradient", params + zs, grads, name=_PREFIX + "gradient",
                                  domain=TRAINING_DOMAIN, xs=params, zs=zs, y=loss_name))
    nodes.append(helper.make_node("Add", [T, one], [T_next], name=_PREFIX + "count"))
    kinds = _STATES[optimizer]
    states = {k: [f"{_PREFIX}{k}.{p}" for p in params] for k in kinds}
    new = {p: _PREFIX + "new." + p for p in params + [s for k in kinds for s in states[k]]}
    op_inputs = [R, T_next if optimizer == "adam" else T] + params + grads + \
        [s for k in kinds for s in states[k]]
    op_outputs = [new[p] for p in params] + [new[s] for k in kinds for s in states[k]]
    op_type = {"adam": "Adam", "adagrad": "Adagrad", "momentum": "Momentum"}[optimizer]
    nodes.append(helper.make_node(op_type, op_inputs, op_outputs, name=_PREFIX + optimizer,
                                  domain=TRAINING_DOMAIN, **optimizer_attrs))

    alg_inits = [numpy_helper.from_array(np.array(lr, dtype=dtype), R),
                 numpy_helper.from_array(np.array(0, dtype=np.int64), T),
                 numpy_helper.from_array(np.array(1, dtype=np.int64), one)]
    init_nodes, init_outputs, init_binding = [], [], []
    for k in kinds:
        for p, s in zip(params, states[k]):
            zeros = numpy_helper.from_array(np.zeros_like(inits[p]), s)
            alg_inits.append(zeros)
            init_nodes.append(helper.make_node("Constant", [], [s + ".init"], value=zeros))
            init_outputs.append(helper.make_tensor_value_info(s + ".init", zeros.data_type,
                                                              inits[p].shape))
            init_binding.append((s, s + ".init"))
    t0 = numpy_helper.from_array(np.array(0, dtype=np.int64), T)
    init_nodes.append(helper.make_node("Constant", [], [T + ".init"], value=t0))
    init_outputs.append(helper.make_tensor_value_info(T + ".init", onnx.TensorProto.INT64, []))
    init_binding.append((T, T + ".init"))

    def info(name, like):
        return helper.make_tensor_value_info(name, like.data_type, list(like.dims))

    by_name = {t.name: t for t in list(graph.initializer) + alg_inits}
    alg_outputs = [helper.make_tensor_value_info(loss_name, helper.np_dtype_to_tensor_dtype(dtype),
                                                 [])] if loss_name not in outputs else []
    alg_outputs += [info(new[p], by_name[p]) for p in params]
    alg_outputs += [info(new[s], by_name[s]) for k in kinds for s in states[k]]
    alg_outputs.append(helper.make_tensor_value_info(T_next, onnx.TensorProto.INT64, []))

    training = model.training_info.add()
    training.algorithm.CopyFrom(helper.make_graph(nodes, _PREFIX + "algorithm", alg_inputs,
                                                  alg_outputs, alg_inits))
    training.initialization.CopyFrom(helper.make_graph(init_nodes, _PREFIX + "initialization",
                                                       [], init_outputs))
    for key, value in [(p, new[p]) for p in params] + \
            [(s, new[s]) for k in kinds for s in states[k]] + [(T, T_next)]:
        e = training.update_binding.add()
        e.key, e.value = key, value
    for key, value in init_binding:
        e = training.initialization_binding.add()
        e.key, e.value = key, value
    if TRAINING_DOMAIN not in ops:
        model.opset_import.append(helper.make_opsetid(TRAINING_DOMAIN, 1))
    load_model(model)  # the result must pass onnx.checker
    return model
