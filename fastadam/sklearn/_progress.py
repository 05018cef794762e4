"""Epoch progress for ``verbose`` estimators: a tqdm bar showing the loss when tqdm is installed,
otherwise one ``Iteration N, loss = L`` line per epoch (scikit-learn's format)."""
import sys


class EpochProgress:
    """``update(n_iter, loss, validation_score=None)`` once per epoch; ``close()`` at the end.
    Does nothing when ``verbose`` is false."""

    def __init__(self, verbose, total, desc):
        self.verbose = bool(verbose)
        self._bar = None
        if self.verbose:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, unit="epoch", file=sys.stderr)

    def update(self, n_iter, loss, validation_score=None):
        if not self.verbose:
            return
        if self._bar is not None:
            info = {"loss": f"{loss:.6f}"}
            if validation_score is not None:
                info["val"] = f"{validation_score:.4f}"
            self._bar.set_postfix(info, refresh=False)
            self._bar.update(1)
        else:
            line = f"Iteration {n_iter}, loss = {loss:.8f}"
            if validation_score is not None:
                line += f", validation score = {validation_score:.6f}"
            print(line, flush=True)

    def close(self, message=None):
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.verbose and message:
            print(message, flush=True)
