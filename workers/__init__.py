"""Loops that run: the worker (claim, execute, heartbeat, settle), the lease keeper and the
reaper. They speak to the store only through the ports in `steptrail.domain.ports`."""
