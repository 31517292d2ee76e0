"""The benchmarks' one check that the optional xgboost is installed, with the one line that installs it."""

from __future__ import annotations


def require_xgboost() -> None:
    """Exit with how to install xgboost (the `bench` extra, benchmarks only) when it is missing."""
    try:
        import xgboost  # noqa: F401
    except ImportError:
        raise SystemExit("xgboost is missing: pip install -e '.[bench]' (benchmarks only, ~220 MB)") from None
