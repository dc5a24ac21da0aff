"""RunInstances' parameters, as both launch paths build them (``launch.run_params``), are valid input for EC2's
RunInstances as botocore's own service model describes it (not as corral believes it to be)."""

from __future__ import annotations

import botocore.session
from botocore.validate import ParamValidator

from corral.backends.aws import launch, reservations


def _spec() -> launch.LaunchSpec:
    return launch.LaunchSpec(
        image="ami-0123456789abcdef0",
        instance_type="g5.xlarge",
        spot=True,
        security_group="sg-0123456789abcdef0",
        tags=[{"Key": "corral_instance", "Value": "row-1"}],
        public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0ZXN0 corral",
        iam_instance_profile="corral-jobs",
    )


def _validate(params: dict[str, object]) -> None:
    model = botocore.session.get_session().get_service_model("ec2").operation_model("RunInstances")
    report = ParamValidator().validate(params, model.input_shape)
    assert not report.has_errors(), report.generate_report()


def test_a_single_spot_instance_is_valid_runinstances_input() -> None:
    params = launch.run_params(_spec(), "subnet-0123456789abcdef0", 1, "corral-row-1-1", 100)
    _validate(params)
    assert params["MinCount"] == params["MaxCount"] == 1 and params["InstanceMarketOptions"]["MarketType"] == "spot"
    assert params["IamInstanceProfile"] == {"Name": "corral-jobs"}
    assert params["NetworkInterfaces"][0]["SubnetId"] == "subnet-0123456789abcdef0"


def test_a_gang_into_a_reservation_and_a_placement_group_is_valid_runinstances_input() -> None:
    extra = {
        "CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": "cr-0123"}},
        "Placement": {"GroupName": "dstack-main-fleet-ab12"},
    }
    spec = launch.LaunchSpec(
        image="ami-0123456789abcdef0",
        instance_type="p4d.24xlarge",
        spot=False,
        security_group="sg-0123456789abcdef0",
        tags=[],
        public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0ZXN0 corral",
        public_ip=False,
        extra=extra,
    )
    params = launch.run_params(spec, "subnet-0123456789abcdef0", 4, "corral-row-1-2", 100)
    _validate(params)
    assert params["MinCount"] == params["MaxCount"] == 4 and "InstanceMarketOptions" not in params
    assert params["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is False and "IamInstanceProfile" not in params


def test_a_launch_into_a_capacity_block_is_valid_runinstances_input() -> None:
    block = reservations.Reserved("cr-0123", "p5.48xlarge", "us-east-1b", "us-east-1", "active", 2,
                                  reservation_type="capacity-block")  # fmt: skip
    spec = launch.LaunchSpec(
        image="ami-0123456789abcdef0",
        instance_type="p5.48xlarge",
        spot=False,
        security_group="sg-0123456789abcdef0",
        tags=[],
        public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0ZXN0 corral",
        extra=reservations.launch_params(block),
    )
    params = launch.run_params(spec, "subnet-0123456789abcdef0", 2, "corral-row-1-1", 100)
    _validate(params)
    assert params["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
