"""The one place that imports scikit-learn for ``fastadam.sklearn`` and says clearly when it is
missing (``import fastadam`` itself never imports scikit-learn)."""
try:
    import sklearn  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    raise ImportError("fastadam.sklearn needs scikit-learn (>= 1.6): "
                      "pip install 'fastadam[sklearn]'") from exc

from sklearn.utils.validation import validate_data  # noqa: F401,E402  (scikit-learn >= 1.6)
