"""Apply policies: dstack's ``ApplyPolicy`` hooks, which may refuse or rewrite a run, fleet, volume or gateway
spec before it is applied, in the shape of dstack 0.22.5's built-in ``rest_plugin`` -- an external HTTP
policy service that the server asks with the spec and the user, and that answers with the spec to apply
(as sent, or changed) or an error that refuses the apply (docs/policies.md).

Owns: the policies a server runs (:class:`rest.RestPolicy`, built from ``config.yml``'s ``plugins`` and the
service's URL), the REST plugin's wire shape and its call (with a timeout; a service that does not answer
refuses the apply: it fails closed), and :class:`rest.PolicyError`, the refusal that names the policy.

May import: the standard library, pydantic and httpx (imported on the first call); no package of corral, so
that the context and the services may hold it. The services call it at the edge of each use case, before
anything is written (``services.apply_policies``).
"""
