"""The gateway process: a single Python process on a gateway host that terminates TLS by SNI with per-host
certificates, answers ACME HTTP-01 challenges and redirects to https on :80, applies services' rate limits,
checks clients' tokens against the corral server (cached), forwards requests (streamed, websockets too) to the
server's in-server proxy, counts per-service stats, and serves a management API the server drives.

It owns: its command line (``cli``), its state directory (``statefile``), its listeners (``listeners``,
``forward``, ``httpio``), its management API (``management``) and its zipapp (``zipapp``); ``core`` holds the
pure decisions (state model and validation, routing, rate-limit buckets, stats windows, the auth cache, the
certificate's dates).

May import: the standard library only (Python 3.9+), nothing of corral but itself: it ships as its own zipapp
(``python3 -I corral-gateway.pyz serve ...``) to hosts that have only the ``python3`` they already carry.
One exception, outside the archive: ``zipapp``'s build, run where the archive is built, imports the archive
writer it shares with the agent's (``corral.zipapps``, standard library only) when it is called.
"""
