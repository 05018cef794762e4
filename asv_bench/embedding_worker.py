"""FBGEMM's side of ``embedding_report.py --fbgemm``: runs inside the environment that
``asv_bench/fbgemm_env.sh`` builds (never in fastadam's: it imports no fastadam), driven by the
report through its standard input and output, one JSON object a line each way.

The model is one table of FBGEMM's table-batched embedding
(``SplitTableBatchedEmbeddingBagsCodegen``, one ``(rows, dim)`` float32 table on the host, sum
pooling): a step is TorchRec's training step of that table, the pooled lookup ``out =
tbe(ids, offsets)`` then ``out.backward(grad_out)``, whose backward sorts the ids, sums each
touched row's gradient and applies the optimizer to those rows in place (FBGEMM's fused update:
no gradient tensor of the table is made).  Optimizers: ``exact_adagrad`` (``h += g*g; w -= lr *
g / (sqrt(h) + eps)`` per element) and ``exact_rowwise_adagrad`` (``h[r] += mean(g*g); w -= lr
* g / (sqrt(h[r]) + eps)``), no weight decay.

Requests (``op``): ``setup`` (rows, dim, seed: the table is
``numpy.random.default_rng(seed).standard_normal((rows, dim), dtype=float32)``, as the report
makes it; optimizer, lr, eps; threads: torch's intra-op threads; npz: ``ids``, ``offsets``
(n_bags + 1 entries) and ``grad_out`` (n_bags x dim)) answers the versions and a checksum of
the table; ``steps`` (n) runs n steps untimed; ``time`` (n, clock: "wall" or "cpu", the
process's CPU time) runs n steps and answers each one's seconds; ``rows`` (rows: npz path holding ``rows``, out: npz path) writes the table's and
the optimizer state's values at those rows; ``free`` drops the table; ``quit``.
"""
import json
import sys
import time

import numpy as np


class Table:
    def __init__(self, req):
        import torch
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (EmbeddingLocation,
                                                                          PoolingMode)
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)

        self.torch = torch
        torch.set_num_threads(int(req["threads"]))
        rows, dim = int(req["rows"]), int(req["dim"])
        optim = {"exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
                 "exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[req["optimizer"]]
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)], optimizer=optim,
            learning_rate=float(req["lr"]), eps=float(req["eps"]), weight_decay=0.0,
            pooling_mode=PoolingMode.SUM, weights_precision=SparseType.FP32,
            output_dtype=SparseType.FP32, device=torch.device("cpu"))
        weight = self.tbe.split_embedding_weights()[0]
        rng = np.random.default_rng(int(req["seed"]))
        with torch.no_grad():
            weight.copy_(torch.from_numpy(rng.standard_normal((rows, dim), dtype=np.float32)))
        with np.load(req["npz"]) as data:
            self.ids = torch.from_numpy(data["ids"].astype(np.int64))
            self.offsets = torch.from_numpy(data["offsets"].astype(np.int64))
            self.grad_out = torch.from_numpy(np.ascontiguousarray(data["grad_out"]))
        self.checksum = float(weight[:64].double().sum())

    def step(self):
        out = self.tbe(self.ids, self.offsets)
        out.backward(self.grad_out)

    def rows(self, req):
        with np.load(req["rows"]) as data:
            rows = self.torch.from_numpy(data["rows"].astype(np.int64))
        weight = self.tbe.split_embedding_weights()[0].detach()
        state = self.tbe.split_optimizer_states()[0][0].detach()
        state = state.reshape(weight.shape[0], -1)  # (rows, dim) or (rows, 1) for row-wise
        np.savez(req["out"], weight=weight[rows].numpy(), state=state[rows].numpy())


def main():
    table = None
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "quit":
            break
        if op == "setup":
            import fbgemm_gpu
            import torch

            table = None
            table = Table(req)
            answer = {"fbgemm_gpu": fbgemm_gpu.__version__, "torch": torch.__version__,
                      "numpy": np.__version__, "checksum": table.checksum}
        elif op == "steps":
            for _ in range(int(req["n"])):
                table.step()
            answer = {}
        elif op == "time":
            timer = time.process_time if req.get("clock") == "cpu" else time.perf_counter
            times = []
            for _ in range(int(req["n"])):
                start = timer()
                table.step()
                times.append(timer() - start)
            answer = {"times": times}
        elif op == "rows":
            table.rows(req)
            answer = {}
        elif op == "free":
            table = None
            answer = {}
        else:
            answer = {"error": f"unknown op {op!r}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
