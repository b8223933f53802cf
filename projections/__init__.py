"""Read models of the run log. Each is a pure fold over events and can be rebuilt from the log.

Folds live here; the SQL that maintains them lives in `infrastructure/`.
"""
