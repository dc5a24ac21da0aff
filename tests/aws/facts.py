"""What AWS really is, as far as the aws backend's tests need it: image owners and names, limits, error codes.

Each value is a literal with its public source beside it. This module never imports corral: the tests
compare corral's constants with these values (``test_aws_facts.py``) and seed moto with them
(``moto_harness.AMIS``), so a wrong constant in corral fails a test instead of agreeing with itself.
"""

from __future__ import annotations

# ---- images ---------------------------------------------------------------------------------------------
#: Canonical's account, the owner of the official Ubuntu AMIs. Source: hashicorp/terraform-provider-aws,
#: website/docs/r/instance.html.markdown: ``owners = ["099720109477"] # Canonical``.
CANONICAL_OWNER = "099720109477"
#: Ubuntu 22.04 (jammy) amd64 server AMIs are named ``ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-<date>``.
#: Source: the same terraform page (``values = ["ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"]``).
UBUNTU_2204_PATTERN = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"
UBUNTU_2204_NAME = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20261101"
#: Ubuntu 24.04 (noble) images moved to an ``hvm-ssd-gp3`` path. Source: Canonical's "Find Ubuntu images on
#: AWS" (documentation.ubuntu.com/aws/aws-how-to/instances/find-ubuntu-images/): ``ubuntu/images/hvm-ssd-gp3/
#: ubuntu-noble-24.04-amd64-server-*``.
UBUNTU_2404_PATTERN = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"
UBUNTU_2404_NAME = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20261115"
#: The AWS Deep Learning Base GPU AMI's owner (alias ``amazon``). Source: dstackai/dstack
#: src/dstack/_internal/core/backends/aws/resources.py ``DLAMI_OWNER_ACCOUNT_ID = "898082745236"``; public
#: ``aws ec2 describe-images --owners amazon`` outputs show it with ``ImageOwnerAlias: amazon``.
DLAMI_OWNER = "898082745236"
#: Its name: ``Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) <date>``. Source: AWS DLAMI release
#: notes (docs.aws.amazon.com/dlami/latest/devguide/appendix-ami-release-notes.html) and dstack's resources.py.
DLAMI_PATTERN = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"
DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20261006"
#: Root device names: Ubuntu and the DLAMI boot from ``/dev/sda1``, Amazon Linux from ``/dev/xvda``.
#: Source: EC2 User Guide, "Device names on Linux instances" (device_naming.html).
UBUNTU_ROOT_DEVICE = "/dev/sda1"
AMAZON_LINUX_ROOT_DEVICE = "/dev/xvda"
#: Amazon Linux 2023: owner 137112412989 (Amazon), names ``al2023-ami-<version>-kernel-<k>-x86_64``. Source:
#: public terraform code, e.g. ``owners = ["137112412989"] # Amazon`` with ``values = ["al2023-ami-*-x86_64"]``;
#: Amazon Linux 2023 User Guide, "Amazon Linux 2023 on Amazon EC2" (the AMI name format).
AMAZON_LINUX_OWNER = "137112412989"
AMAZON_LINUX_PATTERN = "al2023-ami-*-x86_64"
AMAZON_LINUX_NAME = "al2023-ami-2023.6.20261101.0-kernel-6.1-x86_64"

# ---- tags -----------------------------------------------------------------------------------------------
#: Source: EC2 User Guide, "Tag your Amazon EC2 resources", Tag restrictions (Using_Tags.html#tag-restrictions):
#: at most 50 tags per resource, keys 1-128 characters, values at most 256, ``aws:`` reserved (either case),
#: letters, digits, spaces and ``+ - = . _ : / @`` allowed across services.
TAGS_PER_RESOURCE = 50
TAG_KEY_MAX = 128
TAG_VALUE_MAX = 256
TAG_RESERVED_PREFIX = "aws:"
TAG_ALLOWED_PUNCTUATION = "+-=._:/@ "
#: The error EC2 answers past 50 tags. Source: AWS "Error codes for the Amazon EC2 API" (errors-overview).
TAG_LIMIT_EXCEEDED = "TagLimitExceeded"

# ---- error codes (source: AWS "Error codes for the Amazon EC2 API", errors-overview.html) ----------------
INSUFFICIENT_CAPACITY = "InsufficientInstanceCapacity"  # server error (5xx): no capacity in the zone
INSUFFICIENT_SUBNET_ADDRESSES = "InsufficientFreeAddressesInSubnet"  # the subnet is full: another zone's will do
INSUFFICIENT_ADDRESS_CAPACITY = "InsufficientAddressCapacity"  # server error: transient
SERVER_INTERNAL = "ServerInternal"  # server error: transient
INTERNAL_FAILURE = "InternalFailure"  # server error: transient
VCPU_LIMIT = "VcpuLimitExceeded"  # the account's vCPU quota of the market and family group
SPOT_COUNT_LIMIT = "MaxSpotInstanceCountExceeded"  # the spot quota
SECURITY_GROUPS_LIMIT = "SecurityGroupsPerInstanceLimitExceeded"  # a parameter problem, not a quota of the region
RESERVATION_FULL = "ReservationCapacityExceeded"  # the targeted Capacity Reservation has no free instance
RESERVATION_PENDING = "InvalidCapacityReservationState.PendingActivation"  # a Capacity Block not active yet
AUTH_FAILURE = "AuthFailure"  # credentials not valid
UNAUTHORIZED = "UnauthorizedOperation"  # the caller lacks the IAM permission
SUBNET_NOT_FOUND = "InvalidSubnetID.NotFound"
GROUP_NOT_FOUND = "InvalidGroup.NotFound"
AMI_NOT_FOUND = "InvalidAMIID.NotFound"

# ---- capacity blocks ------------------------------------------------------------------------------------
#: A Capacity Block's DescribeCapacityReservations ``ReservationType``, and the ``InstanceMarketOptions`` a
#: launch into it needs. Sources: EC2 API reference, CapacityReservation ``reservationType``
#: (``default | capacity-block``) and InstanceMarketOptionsRequest ``MarketType`` (``spot | capacity-block``);
#: EC2 User Guide, "Launch instances using Capacity Blocks".
CAPACITY_BLOCK = "capacity-block"

# ---- placement groups -----------------------------------------------------------------------------------
#: Families a cluster placement group refuses. Source: EC2 User Guide, "Placement groups" rules: "current
#: generation instances, except for burstable performance instances (for example, T2), Mac1 instances, and
#: M7i-flex instances".
CLUSTER_REFUSED = ("t2.micro", "t3.large", "t3a.large", "t4g.large", "mac1.metal", "m7i-flex.large")
CLUSTER_ACCEPTED = ("m7i.large", "c5.2xlarge", "p4d.24xlarge", "g5.xlarge")

# ---- zones ----------------------------------------------------------------------------------------------
#: DescribeAvailabilityZones' ``ZoneType``: ``availability-zone``, ``local-zone`` or ``wavelength-zone``; Local
#: Zones are named like ``us-east-1-atl-2a``. Source: EC2 API reference, AvailabilityZone ``zoneType``.
ZONE_TYPE_AZ = "availability-zone"
LOCAL_ZONE_NAME = "us-east-1-atl-2a"

# ---- prices ---------------------------------------------------------------------------------------------
#: Every public IPv4 address costs $0.005 an hour since 2024-02-01. Source: AWS News Blog, "New AWS Public
#: IPv4 Address Charge + Public IP Insights" (2023-07-28).
PUBLIC_IPV4_PER_HOUR = 0.005
