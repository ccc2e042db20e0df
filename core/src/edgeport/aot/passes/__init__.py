"""Graph passes of the edge and execution stages."""
