"""corral's in-server proxy to services: ``/proxy/services/<project>/<run>/...`` forwarded to the run's
ready replicas (auth by a project member's token unless ``auth: false``, ``strip_prefix``, streaming both
ways, least-in-flight choice, keep-alive upstream connections, one retry on another replica).

An edge, like ``api``: it asks ``services`` (routes, membership) and reaches replicas through the channel
``backends`` has to each host (``backends.replica_port``, ``backends.http1``); never ``store`` directly.
Imported on the first proxied request, not at start-up.

May import: corral.domain, corral.services, corral.backends, corral.context.
"""
