"""Tests of the documentation site: it builds strictly, its reference matches the code, and
every example it shows runs (ADR 0072)."""
