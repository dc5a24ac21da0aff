"""The ACME settings: corral's names, dstack's as the fallback, and clear errors for unusable values."""

from __future__ import annotations

import pathlib

import pytest

from corral.settings import Settings, SettingsError

#: Let's Encrypt's production directory (https://letsencrypt.org/docs/client-options/).
LETS_ENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"


def test_the_default_ca_is_lets_encrypt_and_the_system_store_checks_it() -> None:
    s = Settings.from_env({})
    assert (s.acme_server, s.acme_eab_kid, s.acme_eab_hmac_key, s.acme_ca_bundle) == (LETS_ENCRYPT, None, None, None)


def test_the_account_is_checked_every_five_minutes_unless_set() -> None:
    assert Settings.from_env({}).acme_account_check_interval == 300.0
    assert Settings.from_env({"CORRAL_ACME_ACCOUNT_CHECK_INTERVAL": "30"}).acme_account_check_interval == 30.0


def test_corral_names_win_over_dstacks(tmp_path: pathlib.Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    dstack = {
        "DSTACK_ACME_SERVER": "https://acme.zerossl.com/v2/DV90",
        "DSTACK_ACME_EAB_KID": "dkid",
        "DSTACK_ACME_EAB_HMAC_KEY": "dkey",
    }
    s = Settings.from_env(dstack)
    assert (s.acme_server, s.acme_eab_kid, s.acme_eab_hmac_key) == ("https://acme.zerossl.com/v2/DV90", "dkid", "dkey")
    s = Settings.from_env(
        dstack
        | {
            "CORRAL_ACME_SERVER": "https://10.0.0.1:14000/dir",
            "CORRAL_ACME_EAB_KID": "kid",
            "CORRAL_ACME_EAB_HMAC_KEY": "key",
            "CORRAL_ACME_CA_BUNDLE": str(bundle),
        }
    )
    assert (s.acme_server, s.acme_eab_kid, s.acme_eab_hmac_key) == ("https://10.0.0.1:14000/dir", "kid", "key")
    assert s.acme_ca_bundle == bundle


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"CORRAL_ACME_SERVER": "acme.example.com/dir"}, ["CORRAL_ACME_SERVER", "URL"]),
        ({"CORRAL_ACME_EAB_KID": "kid"}, ["CORRAL_ACME_EAB_KID", "CORRAL_ACME_EAB_HMAC_KEY"]),
        ({"DSTACK_ACME_EAB_HMAC_KEY": "key"}, ["DSTACK_ACME_EAB_HMAC_KEY", "CORRAL_ACME_EAB_KID"]),
        ({"CORRAL_ACME_CA_BUNDLE": "/nonexistent/ca.pem"}, ["CORRAL_ACME_CA_BUNDLE", "not a file"]),
        ({"CORRAL_ACME_ACCOUNT_CHECK_INTERVAL": "0"}, ["CORRAL_ACME_ACCOUNT_CHECK_INTERVAL", "above 0"]),
        ({"CORRAL_ACME_ACCOUNT_CHECK_INTERVAL": "off"}, ["CORRAL_ACME_ACCOUNT_CHECK_INTERVAL", "above 0"]),
        ({"CORRAL_ACME_ACCOUNT_CHECK_INTERVAL": "5m"}, ["CORRAL_ACME_ACCOUNT_CHECK_INTERVAL", "seconds"]),
    ],
)
def test_unusable_values_are_refused_naming_the_setting(env: dict[str, str], names: list[str]) -> None:
    with pytest.raises(SettingsError) as e:
        Settings.from_env(env)
    for name in names:
        assert name in str(e.value)
