"""The one home of fastadam.sklearn's scikit-learn version checks (``import fastadam`` itself
never imports scikit-learn).

- ``SKLEARN_VERSION``: the installed release as ``(major, minor)``;
- ``SKLEARN_FLOOR``: the oldest release this package supports and CI tests (pyproject.toml's
  floor): 1.7, the first whose MLP takes ``sample_weight`` in its private mini-batch methods and
  has the ``exp`` output / ``poisson`` loss entries ``accelerate_mlp()`` reproduces;
- ``SKLEARN_NEWEST_TESTED``: the newest release CI tests ``accelerate_mlp()`` on;
- ``mlp_version_known()``: whether ``accelerate_mlp()``, which replaces scikit-learn's private
  mini-batch loop, knows the installed release; on any other it runs scikit-learn's own loop
  with one warning.

scikit-learn's private utilities the estimators use (``validate_data``, ``_check_sample_weight``,
the parameter constraints, ``available_if``) are imported here and nowhere else, so a release
that moves one breaks one line; the private MLP modules ``accelerate_mlp()`` patches are
imported by ``_accelerate`` and ``_sk_backprop`` behind its contract check.
"""
import re

try:
    import sklearn
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    raise ImportError("fastadam.sklearn needs scikit-learn (>= 1.7): pip install "
                      "'scikit-learn>=1.7' (or, in a fastadam checkout, pip install "
                      "'.[sklearn]')") from exc

# the estimators' private scikit-learn utilities (all present from 1.6 to the newest tested)
from sklearn.utils._available_if import available_if  # noqa: F401,E402
from sklearn.utils._param_validation import Interval, StrOptions  # noqa: F401,E402
from sklearn.utils.validation import _check_sample_weight, validate_data  # noqa: F401,E402

SKLEARN_FLOOR = (1, 7)
SKLEARN_NEWEST_TESTED = (1, 9)


def parse_version(version):
    """``(major, minor)`` of a release string ("1.9.1", "1.10.dev0"); ValueError otherwise."""
    match = re.match(r"(\d+)\.(\d+)", str(version))
    if match is None:
        raise ValueError(f"version: expected a release like '1.7', got {version!r}")
    return int(match.group(1)), int(match.group(2))


SKLEARN_VERSION = parse_version(sklearn.__version__)


def mlp_version_known():
    """True if ``accelerate_mlp()`` was tested with the installed scikit-learn's private MLP
    (from ``SKLEARN_FLOOR`` to ``SKLEARN_NEWEST_TESTED``, by minor release)."""
    return SKLEARN_FLOOR <= SKLEARN_VERSION <= SKLEARN_NEWEST_TESTED


def version_string(version):
    return ".".join(str(v) for v in version)
