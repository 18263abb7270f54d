"""vramguard: a node agent that enforces per-pod GPU memory quotas on Kubernetes."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vramguard")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
