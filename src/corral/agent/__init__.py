"""The host agent: a small HTTP daemon on every instance that runs job processes, captures their
logs with timestamps and reports resources. Standard library only, shippable as a zipapp;
``protocol.py`` holds the wire format (plain dataclasses) that the server imports too.
The one import of corral outside it: ``zipapp``'s build, run where the archive is built, imports the archive
writer it shares with the gateway's (``corral.zipapps``, standard library only, not shipped) when it is called.
"""
