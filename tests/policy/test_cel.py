"""CEL in the policy: compiled at load (a fault names the file, the line and column, the key, the
kind, the versions and the expression), evaluated with a ValidatingAdmissionPolicy's variables,
failing closed, and never imported by a policy without it. Types: test_cel_types.py; what an
expression reads: test_cel_reads.py; its cost: test_cel_cost.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.policy import Decision, Engine
from gatekeeper.policy.cel import MAX_SOURCE
from gatekeeper.policyfile import parse_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import decide_offline
from gatekeeper.types import Identity, UserInfo

NODE = "node-a"
GPU = Identity("gpu.example.com", "unix")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"

POLICY = """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
drivers: [gpu.example.com]
kinds:
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    verbs: [get, create, update, patch, delete]
{kind_keys}    versions:
      - names: [v1beta2, v1]
        driver: spec.driver
        node: spec.nodeName
        pool: spec.pool.name
{version_keys}"""


def policy(kind_keys: str = "", version_keys: str = "") -> Any:
    kind = textwrap.indent(textwrap.dedent(kind_keys), "    ") if kind_keys else ""
    version = textwrap.indent(textwrap.dedent(version_keys), "        ") if version_keys else ""
    return parse_policy(POLICY.format(kind_keys=kind, version_keys=version), "p.yaml")


def slice_v1(pool: str = "node-a/fpga-0", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s1"},
        "spec": {
            "driver": GPU.driver,
            "nodeName": NODE,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
            **extra,
        },
    }


def create(engine_policy: Any, body: Any, who: Identity = GPU) -> Any:
    return decide_offline(Engine(engine_policy, NODE), who, parse_request("POST", SLICES), body)


FPGA = """\
validations:
  - name: fpga-pools
    expression: object.spec.pool.name.startsWith(variables.node + '/fpga-')
    message: this driver's pools are named <node>/fpga-*
"""


def test_a_validation_narrows_what_the_structural_rule_allows() -> None:
    loaded = policy(version_keys=FPGA)
    assert create(loaded, slice_v1()).allowed
    refused = create(loaded, slice_v1(pool="node-a/gpus"))
    assert (refused.allowed, refused.code, refused.validation) == (False, 403, "fpga-pools")
    assert "resourceslices.resource.k8s.io v1 fpga-pools: this driver's pools" in refused.message
    assert 'User "gpu.example.com" cannot create resource "resourceslices"' in refused.message


def test_the_structural_rule_still_comes_first() -> None:
    refused = create(policy(version_keys=FPGA), slice_v1(pool="node-b/fpga-0"))
    assert not refused.allowed and refused.validation == ""
    assert "is not prefixed by node name" in refused.reason


@pytest.mark.parametrize(
    ("validation", "code", "message"),
    [
        ("reason: Invalid\n  message: nope", 422, "nope"),
        ("reason: Unauthorized", 401, "failed expression: false"),
        ("reason: RequestEntityTooLarge", 413, "failed expression: false"),
        ("messageExpression: \"'on ' + variables.node\"", 403, "on node-a"),
        # A message expression that fails, or gives no string, falls back to the message.
        ("messageExpression: 'object.nope'\n  message: fallback", 403, "fallback"),
        ("messageExpression: \"''\"\n  message: fallback", 403, "fallback"),
    ],
    ids=["invalid", "unauthorized", "too-large", "message-expression", "bad-message-expression",
         "empty-message-expression"],
)  # fmt: skip
def test_reason_and_message_as_an_admission_policy_gives_them(
    validation: str, code: int, message: str
) -> None:
    keys = f"validations:\n- expression: 'false'\n  {validation}\n"
    refused = create(policy(kind_keys=keys), slice_v1())
    assert refused.code == code and refused.message.endswith(f"validations[0]: {message}")


def test_variables_are_evaluated_in_order_and_read_by_later_ones() -> None:
    keys = """\
    variables:
      - name: pool
        expression: object.spec.pool.name
      - name: suffix
        expression: variables.pool.substring(size(variables.node) + 1)
    validations:
      - expression: variables.suffix.startsWith('fpga-')
    """
    loaded = policy(kind_keys=keys)
    assert create(loaded, slice_v1()).allowed
    assert not create(loaded, slice_v1(pool="node-a/gpus")).allowed


def test_a_variable_first_read_by_a_later_validation_is_seen_by_it() -> None:
    """The validations of one write share what the runtime converted; a variable evaluated
    after the first validation ran is still in reach of the next."""
    keys = """\
    variables:
      - name: pool
        expression: object.spec.pool.name
    validations:
      - expression: object.spec.driver == variables.driver
      - expression: variables.pool.startsWith(variables.node + '/fpga-')
      - expression: object.spec.devices.size() == 0
    """
    loaded = policy(kind_keys=keys)
    assert create(loaded, slice_v1()).allowed
    refused = create(loaded, slice_v1(pool="node-a/gpus"))
    assert not refused.allowed and refused.validation == "validations[1]"


def test_the_optional_syntax_of_drivers_admission_policies() -> None:
    keys = """\
    variables:
      - name: userNode
        expression: request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')
      - name: objectNode
        expression: >-
          (request.operation == "DELETE" ? oldObject : object).spec.?nodeName.orValue("")
    validations:
      - expression: variables.userNode == variables.objectNode
    """
    assert create(policy(kind_keys=keys), slice_v1()).allowed


def test_request_and_user_info_of_a_token_are_the_apiservers() -> None:
    user = UserInfo(
        "system:serviceaccount:gpu-system:plugin",
        "uid-1",
        ("system:serviceaccounts", "system:authenticated"),
        {"authentication.kubernetes.io/pod-name": ("plugin-x",)},
    )
    token = Identity(GPU.driver, "token", user=user)
    keys = """\
    validations:
      - expression: >-
          request.operation == 'CREATE' && request.kind.kind == 'ResourceSlice' &&
          request.resource.version == 'v1' && request.name == 's1' &&
          request.userInfo.username == 'system:serviceaccount:gpu-system:plugin' &&
          'system:authenticated' in request.userInfo.groups &&
          variables.namespace == 'gpu-system' && variables.serviceAccount == 'plugin' &&
          variables.pod == 'plugin-x' && variables.podUID == null &&
          variables.driver == 'gpu.example.com' && variables.node == 'node-a'
    """
    assert create(policy(kind_keys=keys), slice_v1(), token).allowed
    # The same rule for a socket caller: no token, so no ServiceAccount, no pod.
    assert not create(policy(kind_keys=keys), slice_v1()).allowed


def test_an_expression_that_fails_at_run_time_refuses_and_names_itself() -> None:
    keys = "validations:\n  - name: reads-a-missing-field\n    expression: object.spec.nope == 1\n"
    refused = create(policy(kind_keys=keys), slice_v1())
    assert (refused.allowed, refused.code) == (False, 403)
    assert refused.validation == "reads-a-missing-field"
    assert "reads-a-missing-field could not be evaluated" in refused.message
    assert "a rule that cannot be evaluated refuses the request" in refused.message


def test_a_failing_variable_refuses_and_names_itself() -> None:
    keys = (
        "variables:\n  - name: broken\n    expression: object.spec.nope\n"
        "validations:\n  - expression: variables.broken == 1\n"
    )
    refused = create(policy(kind_keys=keys), slice_v1())
    assert not refused.allowed and refused.validation == "variables.broken"


def test_a_failing_variable_a_short_circuit_skips_refuses_nothing() -> None:
    """As in an admission policy: ``object`` is null on a DELETE, and a variable that reads it
    fails, but a validation that does not reach it on a DELETE is not refused for it."""
    keys = (
        "variables:\n  - name: pool\n    expression: object.spec.pool.name\n"
        "validations:\n  - expression: >-\n      request.operation == 'DELETE' ||\n"
        "      variables.pool.startsWith(variables.node + '/fpga-')\n"
    )
    loaded = policy(kind_keys=keys)
    stored = slice_v1()
    stored["metadata"].update(resourceVersion="3", uid="u")
    info = parse_request("DELETE", f"{SLICES}/s1")
    assert decide_offline(Engine(loaded, NODE), GPU, info, None, stored).allowed
    refused = create(loaded, slice_v1(pool="node-a/gpus"))
    assert not refused.allowed and refused.validation == "validations[0]"


def test_variables_are_lazy_as_in_an_admission_policy() -> None:
    """A variable no evaluated expression reads is never evaluated: it cannot refuse."""
    keys = (
        "variables:\n  - name: broken\n    expression: object.spec.nope\n"
        "  - name: fine\n    expression: object.spec.driver\n"
        "validations:\n  - expression: variables.fine == variables.driver\n"
    )
    assert create(policy(kind_keys=keys), slice_v1()).allowed


def test_all_validations_hold_in_one_evaluation_and_a_failing_one_is_still_named() -> None:
    """The validations of a write are evaluated together first (the usual case: all hold);
    when they do not all hold, one by one, as an admission policy does: the first that fails
    refuses, with its own message, even if a later one errs."""
    keys = """\
    variables:
      - name: pool
        expression: object.spec.pool.name
    validations:
      - name: fpga
        expression: variables.pool.startsWith(variables.node + '/fpga-')
        message: an fpga pool
      - name: errs
        expression: object.spec.devices[0].name == ''
    """
    loaded = policy(kind_keys=keys)
    assert create(loaded, slice_v1(devices=[{"name": ""}])).allowed
    refused = create(loaded, slice_v1(pool="node-a/gpu", devices=[]))
    assert (refused.validation, refused.message.endswith("fpga: an fpga pool")) == ("fpga", True)
    erred = create(loaded, slice_v1(devices=[]))
    assert erred.validation == "errs" and "errs could not be evaluated" in erred.message


BAD_EXPRESSIONS = [
    (
        "syntax",
        "validations:\n  - expression: 'object.spec =='\n",
        # The column is the file's: just after the expression's last character.
        "p.yaml:12:36: kinds[0].validations[0].expression: resourceslices.resource.k8s.io: "
        "Syntax error: mismatched input '<EOF>'",
    ),
    (
        "type",
        "validations:\n  - expression: \"'a' + 1\"\n",
        "found no matching overload for '_+_' applied to '(string, int)'",
    ),
    (
        "not-bool",
        "validations:\n  - expression: \"'x'\"\n",
        "validations[0].expression: resourceslices.resource.k8s.io: must evaluate to a bool",
    ),
    (
        "unknown-variable",
        "validations:\n  - expression: variables.nod == 'x'\n",
        "p.yaml:12:21: kinds[0].validations[0].expression: resourceslices.resource.k8s.io: "
        "reads variables.nod, which is not defined (defined: driver, namespace, node, pod, "
        "podUID, serviceAccount; a variable is read after it is defined)",
    ),
    (
        "kubernetes-library",
        "validations:\n  - expression: quantity('1Gi') > 0\n",
        "undeclared reference to 'quantity'",
    ),
    ("no-expression", "validations:\n  - message: m\n", "validations[0].expression: is required"),
    (
        "bad-reason",
        "validations:\n  - expression: 'true'\n    reason: Nope\n",
        "'Nope' is not one of Forbidden",
    ),
    (
        "two-line-message",
        "validations:\n  - expression: 'true'\n    message: \"a\\nb\"\n",
        "'a\\nb' is not one line (it is a Status message)",
    ),
    (
        "shadows-built-in",
        "variables:\n  - name: node\n    expression: '1'\n",
        "'node' is defined already",
    ),
    ("bad-name", "variables:\n  - name: 1x\n    expression: '1'\n", "'1x' is not a variable name"),
    ("empty", "validations: []\n", "p.yaml:11: kinds[0].validations: must be a non-empty list"),
    (
        "too-long",
        f'validations:\n  - expression: "{"true && " * (MAX_SOURCE // 8)}true"\n',
        "characters long (at most 5120)",
    ),
]


@pytest.mark.parametrize(
    ("kind_keys", "message"),
    [case[1:] for case in BAD_EXPRESSIONS],
    ids=[case[0] for case in BAD_EXPRESSIONS],
)
def test_a_bad_expression_is_a_load_error_naming_where(kind_keys: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        policy(kind_keys=kind_keys)
    assert message in str(caught.value)


def test_a_version_level_error_names_the_versions() -> None:
    with pytest.raises(ConfigError) as caught:
        policy(version_keys="validations:\n  - expression: 'object.spec =='\n")
    assert "kinds[0].versions[0].validations[0].expression: resourceslices" in str(caught.value)
    assert "resourceslices.resource.k8s.io v1beta2, v1: Syntax error" in str(caught.value)


def test_too_many_expressions_for_one_version_are_refused() -> None:
    keys = "validations:\n" + "".join("  - expression: 'true'\n" for _ in range(65))
    with pytest.raises(ConfigError, match="has 65 CEL expressions"):
        policy(kind_keys=keys)


def test_deletecollection_cannot_be_allowed_with_cel() -> None:
    text = POLICY.format(kind_keys="    validations: [{expression: 'true'}]\n", version_keys="")
    text = text.replace("[get, create, update, patch, delete]", "[get, deletecollection]")
    with pytest.raises(ConfigError, match="deletecollection cannot be allowed"):
        parse_policy(text, "p.yaml")


def test_a_policy_without_cel_never_imports_the_runtime() -> None:
    probe = (
        "import sys\n"
        "from gatekeeper.policyfile import load_policy\n"
        "load_policy(None)\n"
        "print('cel_expr_python' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    policy(version_keys=FPGA)
    assert "cel_expr_python" in sys.modules


@pytest.mark.parametrize(
    ("expression", "reads"),
    [
        ("object.spec.pool.name.startsWith(variables.node + '/fpga-')", False),
        ("object.metadata.name != 'oldObject'", False),  # the name in a literal reads nothing
        ("oldObject == null || object.spec.pool.name == oldObject.spec.pool.name", True),
        ("variables.stored == ''", True),  # through a variable that reads it
    ],
)
def test_an_update_is_read_first_only_when_its_cel_names_the_stored_object(
    expression: str, reads: bool
) -> None:
    """docs/security.md "Updates without a read": CEL that never names ``oldObject`` cannot
    depend on the stored object, so an update carrying its resourceVersion skips the read as it
    does without CEL; an expression that names it, directly or through a variable, gets the
    stored object read first."""
    keys = f"""\
    apiserverImmutable: [driver, node, pool]
    variables:
      - name: stored
        expression: "oldObject == null ? '' : oldObject.metadata.name"
    validations:
      - expression: "{expression}"
        message: checked
    """
    engine = Engine(policy(version_keys=keys), NODE)
    body = slice_v1()
    body["metadata"]["resourceVersion"] = "41"
    info = parse_request("PUT", f"{SLICES}/s1")
    plan = engine.accept(engine.screen(GPU, info), "application/json", body)
    assert not isinstance(plan, Decision)
    assert (plan.fetch is not None, plan.unread) == (reads, not reads)
