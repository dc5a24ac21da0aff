"""The ACME server's reset as the store keeps it: none until recorded, the latest of the times replicas record
kept, and each certificate's issuance time read back with it (SQLite and Postgres)."""

from __future__ import annotations

from corral.domain.gateway_ops import CertificateState
from corral.store import gateway_ops as ops_store
from corral.store.db import Database
from corral.store.migrate import upgrade

DIRECTORY = "https://10.77.40.1:14000/dir"


async def test_a_reset_is_recorded_per_directory_and_the_latest_kept(db_url: str) -> None:
    db = Database(db_url)
    await upgrade(db)
    try:
        async with db.write() as conn:
            await ops_store.record_acme_reset(conn, DIRECTORY, 50.0)  # no account there yet: nothing to reset
            assert await ops_store.acme_reset_at(conn, DIRECTORY) is None
            await ops_store.save_acme_account(conn, DIRECTORY, "sealed-key", 10.0)
            await ops_store.save_acme_account(conn, "https://other.example/dir", "other-key", 10.0)
            assert await ops_store.acme_reset_at(conn, DIRECTORY) is None
            await ops_store.record_acme_reset(conn, DIRECTORY, 100.0)
            await ops_store.record_acme_reset(conn, DIRECTORY, 90.0)  # a replica that saw it earlier, writing later
            assert await ops_store.acme_reset_at(conn, DIRECTORY) == 100.0
            assert await ops_store.acme_reset_at(conn, "https://other.example/dir") is None
            await ops_store.record_acme_reset(conn, DIRECTORY, 200.0)
            assert await ops_store.acme_reset_at(conn, DIRECTORY) == 200.0

            await ops_store.certificate_issued(conn, "gw", "svc.example.test", 150.0, 9e9, 160.0)
            await ops_store.certificate_failed(conn, "gw", "svc.example.test", 170.0, "rate limited")
            assert await ops_store.certificates(conn, "gw") == {
                "svc.example.test": CertificateState("svc.example.test", 150.0, 9e9, 170.0, "rate limited", 160.0)
            }
    finally:
        await db.dispose()
