"""The web UI: server-rendered pages (Jinja2) at dstack's paths (``/runs``, ``/projects/<p>/runs/<id>``,
``/fleets``, ``/instances``, ``/volumes``, ``/models``, ``/offers``, ``/projects``, ``/users``; ``/runs/new``
applies a configuration after its plan), login sessions in an HttpOnly cookie, CSRF and ``Origin`` checks on
every form, a strict Content-Security-Policy, and server-sent events for live run status and log tails.

An edge like ``api/``: it reads and acts only through ``services/`` (the same functions the API routes call,
with the same permission rules) and may use ``api.deps`` for the request plumbing and ``context`` (the
application context); never ``store/`` or SQL. Imported on the first page request (``api/app.py``), never on
the server's start path.
"""
