"""Wire formats of the Arm backends (torch-free readers and writers)."""
