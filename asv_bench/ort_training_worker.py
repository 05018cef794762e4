"""onnxruntime-training's side of ``onnx_report.py --ort``: runs inside the environment that
``asv_bench/ort_training_env.sh`` builds (never in fastadam's: it imports no fastadam), driven
by the report through its standard input and output, one JSON object a line each way.

The model is ``bench_onnx.mlp_model`` (Gemm/Relu/Gemm) on the weights the report sends;
``onnxruntime.training.artifacts.generate_artifacts`` adds the mean cross-entropy loss
(``LossType.CrossEntropyLoss``: SoftmaxCrossEntropyLoss, reduction mean, int64 labels), its
gradient graph and an AdamW optimizer with weight decay 0, bias correction and adam_mode 1
(epsilon added to the uncorrected square root, the step size carrying the corrections: the
update of ONNX's Adam operator, which ``make_training_model`` uses).  One step is what the
onnxruntime-training documentation writes: ``loss = module(X, labels); optimizer.step();
module.lazy_reset_grad()``.

Requests (``op``): ``setup`` (npz: weights W0, b0, ..., X, labels; dir: where the artifacts
go; threads: intra-op threads, 0 = onnxruntime's default) answers the versions and the set-up
seconds; ``time`` (n) runs n steps and answers their CPU time of this thread, of the process,
and their wall time; ``train`` (npz: X, labels, order: batches of row indices) trains from the
initial weights on those batches and answers the losses, writing the trained parameters to
``out`` (npz); ``quit``.

``onnxruntime.training``'s package ``__init__`` imports PyTorch (through ``training.optim``,
which the on-device training API does not use); without torch installed it fails, so the
package is entered without running its ``__init__`` (``_import_training``).
"""
import importlib.util
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "benchmarks"))

import bench_onnx as B  # noqa: E402  (numpy and onnx only)


def _import_training():
    """``(artifacts, api)`` of onnxruntime.training, without its torch-importing ``__init__``."""
    import onnxruntime
    try:
        from onnxruntime.training import api, artifacts
        return artifacts, api
    except ImportError:
        pass
    for name in [m for m in sys.modules if m.startswith("onnxruntime.training")]:
        del sys.modules[name]
    spec = importlib.util.find_spec("onnxruntime.training")
    if spec is None:
        raise ImportError(f"onnxruntime {onnxruntime.__version__} has no training package: "
                          f"install onnxruntime-training-cpu (asv_bench/ort_training_env.sh)")
    sys.modules["onnxruntime.training"] = importlib.util.module_from_spec(spec)
    from onnxruntime.training import api, artifacts
    return artifacts, api


class Trainer:
    def __init__(self, npz, folder, threads):
        import onnx
        import onnxruntime as ort
        ort.set_default_logger_severity(3)  # errors only (the graph transformers log at info)
        artifacts, api = _import_training()
        data = np.load(npz)
        n_layers = sum(k.startswith("W") for k in data.files)
        weights = [data[f"{p}{k}"] for k in range(n_layers) for p in "Wb"]
        self.X, self.y = data["X"], data["labels"]
        start = time.perf_counter()
        os.makedirs(folder, exist_ok=True)
        model = B.mlp_model(weights, weights[0].shape[1])
        self.params = [f"{p}{k}" for k in range(n_layers) for p in "Wb"]
        artifacts.generate_artifacts(
            model, requires_grad=self.params, loss=artifacts.LossType.CrossEntropyLoss,
            optimizer=artifacts.OptimType.AdamW, artifact_directory=folder)
        # the optimizer graph's attributes: Adam of ONNX's convention (see the module note)
        optim_path = os.path.join(folder, "optimizer_model.onnx")
        optim = onnx.load(optim_path)
        for node in optim.graph.node:
            if node.op_type == "AdamWOptimizer":
                for a in node.attribute:
                    if a.name == "alpha":
                        a.f = B.BETA1
                    elif a.name == "beta":
                        a.f = B.BETA2
                    elif a.name == "epsilon":
                        a.f = B.EPS
                    elif a.name == "weight_decay":
                        a.f = 0.0
        onnx.save(optim, optim_path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        options.inter_op_num_threads = 1 if threads == 1 else 0
        self.folder, self.options, self.api = folder, options, api
        self._open()
        self.setup_seconds = time.perf_counter() - start
        self.versions = {"onnxruntime": ort.__version__, "onnx": onnx.__version__,
                         "numpy": np.__version__}

    def _open(self):
        api, folder = self.api, self.folder
        self.state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
        self.module = api.Module(os.path.join(folder, "training_model.onnx"), self.state,
                                 os.path.join(folder, "eval_model.onnx"),
                                 session_options=self.options)
        self.optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"),
                                       self.module)
        self.optimizer.set_learning_rate(B.LR)
        self.module.train()

    def step(self, X, y):
        loss = self.module(X, y)
        self.optimizer.step()
        self.module.lazy_reset_grad()
        return loss

    def time(self, n):
        X, y, step = self.X, self.y, self.step
        t0, c0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
        for _ in range(n):
            step(X, y)
        return {"thread": time.thread_time() - t0, "process": time.process_time() - c0,
                "wall": time.perf_counter() - w0}

    def train(self, npz, out):
        self._open()  # from the initial weights again
        data = np.load(npz)
        X, y = data["X"], data["labels"]
        losses = [float(self.step(np.ascontiguousarray(X[i]), np.ascontiguousarray(y[i])))
                  for i in data["order"]]
        params = {name: np.array(self.state.parameters[name].data) for name in self.params}
        np.savez(out, **params)
        return {"losses": losses}


def main():
    trainer = None
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "setup":
            trainer = Trainer(req["npz"], req["dir"], req["threads"])
            reply = {"versions": trainer.versions, "setup_seconds": trainer.setup_seconds}
        elif op == "time":
            reply = trainer.time(req["n"])
        elif op == "train":
            reply = trainer.train(req["npz"], req["out"])
        elif op == "quit":
            break
        else:
            reply = {"error": f"unknown op {op!r}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
