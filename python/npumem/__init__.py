from npumem._core import __version__

__all__ = ["__version__"]
