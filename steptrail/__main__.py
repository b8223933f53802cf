"""`python -m steptrail` is the `steptrail` command."""

from steptrail.cli import main

main()
