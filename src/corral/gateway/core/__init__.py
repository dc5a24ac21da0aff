"""The gateway's pure core: values and decisions with no I/O, no clocks (``now`` is a parameter) and no asyncio.

``model`` (the state and the validation of management bodies), ``routing`` (what a request on :80/:443 gets),
``ratelimit`` (nginx-like token buckets), ``stats`` (1 s frames, 30/60/300 s windows), ``authcache`` (60 s answers
per project and token), ``der`` (a certificate's expiry, read from its DER). Standard library only.
"""
