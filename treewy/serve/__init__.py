"""Serving with vLLM: the launcher (``treewy serve``), the TreeWY plugin (reconstruct commit in
vLLM's GDN layer), the metrics scraper and the sweep driver (``treewy bench-serve``).

Nothing here imports vllm at import time; see treewy/serve/README.md for what was verified.
"""
