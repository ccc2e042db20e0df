"""Parts of ``bench/xnnpack.py`` (the entry point, run by path): models, timing, instrumentation, report."""
