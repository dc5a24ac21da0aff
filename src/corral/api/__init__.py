"""Thin routers (Starlette routes from `routing.RouteTable`s): parse, authorize, call one service, map errors to
dstack's error bodies.

May import: corral.domain, corral.config, corral.schemas, corral.services, corral.context, corral.settings,
corral.diskspace; ``app.py`` mounts corral.ui and corral.proxy lazily, on first use. Never corral.store, nor SQL.
"""
