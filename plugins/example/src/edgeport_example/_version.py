"""Version of the edgeport-example distribution (recorded in every blob it produces)."""

__version__ = "0.1.0"
