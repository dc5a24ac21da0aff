"""The IAM policy the AWS page documents is the EC2 calls the backend makes: every operation named in the
backend's code (a string that is an operation of EC2's own service model, as botocore describes it), plus
``ec2:CreateTags`` (tagging on creation needs it) and ``iam:PassRole`` (an instance profile). A call added
without its permission, or a permission left after its call went, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import botocore
import botocore.session

ROOT = Path(__file__).resolve().parents[2]
BACKEND = ROOT / "src" / "corral" / "backends" / "aws"
DOCS = ROOT / "docs" / "backends" / "aws.md"


def _ec2_operations_in_code() -> set[str]:
    model = botocore.session.get_session().get_service_model("ec2")
    by_snake = {botocore.xform_name(op): op for op in model.operation_names}
    found: set[str] = set()
    for path in BACKEND.glob("*.py"):
        for literal in re.findall(r'"([a-z]+(?:_[a-z0-9]+)+)"', path.read_text()):
            if literal in by_snake:
                found.add(f"ec2:{by_snake[literal]}")
    return found


def _documented() -> set[str]:
    text = DOCS.read_text()
    section = text[text.index("## IAM permissions") :]
    section = section[: section.index("\n## ", 1)]
    return set(re.findall(r'"((?:ec2|iam):[A-Za-z]+)"', section))


def test_the_documented_iam_policy_is_the_backends_ec2_calls() -> None:
    calls = _ec2_operations_in_code()
    assert {"ec2:RunInstances", "ec2:DescribeRouteTables", "ec2:DetachVolume"} <= calls  # the scan finds them
    assert _documented() == calls | {"ec2:CreateTags", "iam:PassRole"}
