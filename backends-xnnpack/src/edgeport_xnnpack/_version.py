"""Version of the edgeport-xnnpack distribution."""

__version__ = "0.1.0"
