"""Runnable examples: every code example of the docs site is one of these files, included
verbatim (pymdownx.snippets) and run by `tests/docs/test_examples.py` (ADR 0072)."""
