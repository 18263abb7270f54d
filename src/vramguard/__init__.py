"""vramguard: a node agent that enforces per-pod GPU memory quotas on Kubernetes."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # Read from the installed metadata when asked for, not at import: `vramguard-probe` runs every probe period and
    # imports this package, and importlib.metadata is most of an interpreter's start-up.
    if name != "__version__":
        raise AttributeError(f"module 'vramguard' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("vramguard")
    except PackageNotFoundError:  # running from a source tree that was not installed
        found = "0.0.0+unknown"
    globals()["__version__"] = found  # read once
    return found
