"""corral's AWS constants pinned to the facts (``facts.py``, each with its public source), and the image lookup
against moto seeded with public images under their real owners and names."""

from __future__ import annotations

from fnmatch import fnmatchcase

import facts
from moto_harness import AMIS, MotoEC2

from corral.backends.aws import ec2, launch
from corral.domain import aws_tags


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
    cpu, gpu = ec2.image(client, {}, gpu=False), ec2.image(client, {}, gpu=True)
    assert (cpu.image_id, cpu.user, cpu.root_device) == (by_name[facts.UBUNTU_2204_NAME], "ubuntu", "/dev/sda1")
    assert (gpu.image_id, gpu.user) == (by_name[facts.DLAMI_NAME], "ubuntu")


def test_tag_limits_are_awss_and_the_room_left_is_computed_from_corrals_own_tags() -> None:
    assert aws_tags.TAGS_PER_RESOURCE == facts.TAGS_PER_RESOURCE
    assert (aws_tags.KEY_LIMIT, aws_tags.VALUE_LIMIT) == (facts.TAG_KEY_MAX, facts.TAG_VALUE_MAX)
    assert aws_tags.RESERVED_PREFIX == facts.TAG_RESERVED_PREFIX
    # the keys corral writes on a gang member in a placement group: an instance's, its gang's and its group's
    written = {t["Key"] for t in launch.instance_tags("srv", "main", "fl", "row", "fl-0", None)}
    written |= {launch.TAG_GANG, launch.TAG_PLACEMENT}
    assert set(aws_tags.CORRAL_KEYS) == written
    assert facts.TAGS_PER_RESOURCE - len(written) == aws_tags.USER_TAG_LIMIT
    # a Name of 256 characters is AWS's limit, not 255
    name = {t["Key"]: t["Value"] for t in launch.instance_tags("s", "p" * 300, None, "r", "n", None)}["Name"]
    assert len(name) == facts.TAG_VALUE_MAX


def test_a_custom_images_root_device_is_the_one_its_root_volume_names(moto: MotoEC2) -> None:
    """An ``os_images`` AMI whose root is ``/dev/xvda`` (Amazon Linux): the launch's 100 GB volume must name it,
    or EC2 adds a second volume beside the image's own small root."""
    client = moto.client()
    made = next(a["ami_id"] for a in AMIS if a["name"] == facts.AMAZON_LINUX_NAME)
    conf = {"os_images": {"cpu": {"name": facts.AMAZON_LINUX_PATTERN, "owner": facts.AMAZON_LINUX_OWNER,
                                  "user": "ec2-user"}}}  # fmt: skip
    got = ec2.image(client, conf, gpu=False)
    assert (got.image_id, got.user, got.root_device) == (made, "ec2-user", facts.AMAZON_LINUX_ROOT_DEVICE)
    spec = launch.LaunchSpec(image=got.image_id, instance_type="m7i.large", spot=False, security_group="sg-1",
                             tags=[], public_key="ssh-ed25519 AAAA k", root_device=got.root_device)  # fmt: skip
    mapping = launch.run_params(spec, "subnet-1", 1, "corral-row-1", 100)["BlockDeviceMappings"]
    assert mapping == [{"DeviceName": facts.AMAZON_LINUX_ROOT_DEVICE, "Ebs": {"VolumeSize": 100, "VolumeType": "gp3"}}]
