"""Test support shipped with the core: a small model zoo (and, later, the backend conformance suite)."""
