"""The engine's version: the one place it is written (the package, the rows it writes, the
metrics and the image all read it from here)."""

__version__ = "0.1.0"
