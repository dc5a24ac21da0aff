"""Pure values and rules: resources and their grammar, statuses and their transition tables,
runs, jobs, fleets and instances as frozen dataclasses, errors.

Imports nothing from corral and no I/O library: no SQL, HTTP, asyncio or clocks (time is a parameter).
"""
