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
"""
import numpy as np
import onnx
from onnx import helper, numpy_helper

from ._graph import TRAINING_DOMAIN
from ._model import load_model, opsets

_PREFIX = "fastadam."
_STATES = {"adam": ("V", "H"), "adagrad": ("H",), "momentum": ("V",)}


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
                        base_dir=None, **optimizer_attrs):
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
    base_dir : str or os.PathLike, optional
        The folder holding the external data of a ModelProto that has some (refused without
        it); a model given by path reads its external data from its own folder.  The result
        holds every tensor's bytes.
    **optimizer_attrs
        Attributes of the optimizer node (Adam: alpha, beta, epsilon, norm_coefficient,
        norm_coefficient_post; Adagrad: decay_factor, epsilon, norm_coefficient; Momentum:
        alpha, beta, mode, norm_coefficient, all required by the operator).
    """
    src = load_model(inference_model, base_dir)
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
