"""Version of the edgeport-arm distribution."""

__version__ = "0.1.0"
