"""The benchmarking harness of comera-bench (docs/architecture.md)."""
from importlib import metadata


def package_version() -> str:
    """The installed comera-bench version ("" when the package is not installed)."""
    try:
        return metadata.version("comera-bench")
    except metadata.PackageNotFoundError:
        return ""
