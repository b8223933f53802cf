"""`python -m steptrail` is the `steptrail` command."""

from steptrail import _startup

_startup.pause()  # resumed once the command's runtime is open (ADR 0051)

from steptrail.cli import main  # noqa: E402 - imported with the collector paused

main()
