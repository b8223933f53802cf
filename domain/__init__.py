"""The pure core of steptrail: the `Run` aggregate, its events, and the policies that decide.

Nothing in this package performs I/O or reads a clock. Time arrives as an argument or, for
absolute timestamps, is assigned by the store when an event is recorded (ADR 0003).
"""
