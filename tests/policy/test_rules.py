"""Every rule of the policy language, allowed and refused, through the real pipeline: the cases
of tests/policy/rules/rules_test.yaml (run as `dra-gatekeeper test` runs them), and what a YAML
case cannot say (a pod re-created under the caller's pod name, the credential forwarded)."""

from __future__ import annotations

from pathlib import Path

from gatekeeper.policy import Engine
from gatekeeper.policy.model import Credentials, KindRule
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.policytest import load_test_file, run_files
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import decide_offline
from gatekeeper.types import Identity, UserInfo

RULES = Path(__file__).resolve().parent / "rules"
POLICY = load_policy(str(RULES / "rules.yaml"))
NODE = "node-a"
TOKEN = Identity(
    "gpu.example.com",
    "token",
    user=UserInfo(
        "system:serviceaccount:gpu-system:plugin",
        "uid-sa",
        extra={
            "authentication.kubernetes.io/pod-name": ("plugin-x",),
            "authentication.kubernetes.io/pod-uid": ("uid-pod-1",),
        },
    ),
)
OWN_POD = "/api/v1/namespaces/gpu-system/pods/plugin-x"


def test_the_rules_test_file_passes() -> None:
    result = run_files([load_test_file(str(RULES / "rules_test.yaml"))])
    failed = [f"{r.case.name}: {r.mismatches}" for r in result.results if not r.passed]
    assert failed == [] and result.passed == 34


def test_every_rule_is_in_the_rules_test_file() -> None:
    rules = {entry.rule for kind in POLICY.kinds.values() for entry in kind.entries}
    assert rules == set(KindRule)


def test_a_pod_re_created_under_the_callers_name_is_not_the_callers() -> None:
    """OwnPod checks the stored pod's uid against the token's pod-uid: a pod deleted and made
    again under the same name is another pod (the token of the deleted one still passes for a
    few seconds, DESIGN §4.2)."""
    stored = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plugin-x", "namespace": "gpu-system", "uid": "uid-pod-2",
                     "resourceVersion": "3", "labels": {}},
        "spec": {"nodeName": NODE},
    }  # fmt: skip
    patch = {"metadata": {"labels": {"gpu.example.com/ready": "true"}}}
    info = parse_request("PATCH", OWN_POD)
    engine = Engine(POLICY, NODE)
    media = "application/merge-patch+json"
    refused = decide_offline(engine, TOKEN, info, patch, stored, media_type=media)
    assert (refused.allowed, refused.code) == (False, 403)
    assert "the stored pod's metadata.uid \"uid-pod-2\" is not the caller's pod" in refused.reason
    stored["metadata"]["uid"] = "uid-pod-1"
    allowed = decide_offline(engine, TOKEN, info, patch, stored, media_type=media)
    assert allowed.forwards and allowed.body["metadata"]["resourceVersion"] == "3"


def test_driver_credentials_are_marked_on_the_decision_and_nothing_is_read() -> None:
    info = parse_request("PUT", "/apis/example.com/v1/namespaces/gpu-system/widgets/w1/status")
    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}}
    decision = decide_offline(Engine(POLICY, NODE), TOKEN, info, body)
    assert decision.forwards and decision.credentials is Credentials.DRIVER
    assert decision.body == body
    plan = Engine(POLICY, NODE).plan(TOKEN, info)
    assert not isinstance(plan, type(decision)) and plan.fetch is None


def test_an_informer_of_the_own_node_lists_and_watches_it_by_name() -> None:
    """A node informer lists and watches with fieldSelector metadata.name=<node>: allowed where
    the policy lists those verbs, and pinned to this node's name."""
    text = (
        (RULES / "rules.yaml")
        .read_text()
        .replace("    verbs: [get, patch, update]", "    verbs: [get, list, watch, patch, update]")
    )
    policy = parse_policy(text, "p.yaml", directory=str(RULES))
    engine = Engine(policy, NODE)
    for target, allowed in (
        ("/api/v1/nodes?fieldSelector=metadata.name%3Dnode-a", True),
        ("/api/v1/nodes?fieldSelector=metadata.name%3Dnode-a&watch=true", True),
        ("/api/v1/nodes?fieldSelector=metadata.name%3Dnode-b", False),
        ("/api/v1/nodes", False),
    ):
        decision = decide_offline(engine, TOKEN, parse_request("GET", target))
        assert decision.allowed is allowed, (target, decision.reason)
