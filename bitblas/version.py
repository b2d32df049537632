"""The package version (a leaf, so that modules below the package can read it)."""
__version__ = "0.2.0"
