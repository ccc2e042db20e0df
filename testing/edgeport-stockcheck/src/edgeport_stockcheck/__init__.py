"""Test-only helpers of edgeport's test suites that need the stock ExecuTorch runtime (see ``child``)."""
