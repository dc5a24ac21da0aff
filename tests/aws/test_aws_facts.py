"""corral's AWS constants pinned to the facts (``facts.py``, each with its public source), and the image lookup
against moto seeded with public images under their real owners and names."""

from __future__ import annotations

from fnmatch import fnmatchcase

import facts
from moto_harness import AMIS, MotoEC2

from corral.backends.aws import ec2


def test_the_default_images_are_canonicals_ubuntu_and_amazons_dlami() -> None:
    name, owner = ec2.UBUNTU
    assert owner == facts.CANONICAL_OWNER
    assert fnmatchcase(facts.UBUNTU_2204_NAME, name) and not fnmatchcase(facts.UBUNTU_2404_NAME, name)
    gpu_name, gpu_owner = ec2.DLAMI
    assert gpu_owner == facts.DLAMI_OWNER and fnmatchcase(facts.DLAMI_NAME, gpu_name)


def test_the_image_lookup_finds_the_public_images_moto_has_under_their_real_owners(moto: MotoEC2) -> None:
    by_name = {a["name"]: a["ami_id"] for a in AMIS}
    client = moto.client()
    # a newer 24.04 image of the same owner is not a 22.04 one
    assert ec2.image(client, {}, gpu=False) == (by_name[facts.UBUNTU_2204_NAME], "ubuntu")
    assert ec2.image(client, {}, gpu=True) == (by_name[facts.DLAMI_NAME], "ubuntu")
