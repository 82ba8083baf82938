"""CEL in the policy: expressions compiled and type-checked when the policy loads, evaluated purely
per request with the variables of a ValidatingAdmissionPolicy (docs/policy.md#cel-rules).

The runtime is ``cel-expr-python`` (Google's C++ CEL, the optional syntax ``.?``/``[?…]`` and
``orValue`` included), imported on the first compile: a policy without CEL never loads it. What
the policy knows about an expression (the variables it reads, whether it reads ``oldObject``,
the paths of the objects it reads, what it may cost) comes from the checked tree the runtime
evaluates (``_ast``), never from its text. Cost is bounded by construction (``_cost``): an
expression too costly on the largest object is refused at load, a request whose objects make
its CEL too costly is refused before anything is evaluated, and every message an expression
gives is capped.

    _ast        the checked expression, read back from the runtime
    _env        the typed declarations, the checking and the runtime environments
    _program    one expression: compiled, evaluated
    _rewrite    a source rewritten where its tree names a declaration
    _reads      what the expressions read of the objects
    _cut        the objects cut to it, per request
    _poly       the cost's units and polynomials
    _functions  each function's cost
    _cost       an expression's cost, from its tree
    _analysis   a kind version's CEL analysed at load
    _run        a kind version's CEL run on a request
    _rules      the rule set and the engine's calls
"""

from gatekeeper.policy.cel._analysis import ProgramError
from gatekeeper.policy.cel._env import BUILT_INS, signature
from gatekeeper.policy.cel._poly import COST_LIMIT, REQUEST_BUDGET
from gatekeeper.policy.cel._program import (
    MAX_EXPRESSIONS,
    MAX_SOURCE,
    CelError,
    EvaluationError,
    Outcome,
    Program,
    StatusReason,
    Validation,
    Variable,
    activation,
    compile_program,
    evaluate,
)
from gatekeeper.policy.cel._reads import EACH, Path
from gatekeeper.policy.cel._rewrite import rewrite
from gatekeeper.policy.cel._rules import CelRules, cost_bound, in_scope, run_validations
from gatekeeper.policy.cel._run import bindings

__all__ = [
    "BUILT_INS",
    "COST_LIMIT",
    "EACH",
    "MAX_EXPRESSIONS",
    "MAX_SOURCE",
    "REQUEST_BUDGET",
    "CelError",
    "CelRules",
    "EvaluationError",
    "Outcome",
    "Path",
    "Program",
    "ProgramError",
    "StatusReason",
    "Validation",
    "Variable",
    "activation",
    "bindings",
    "compile_program",
    "cost_bound",
    "evaluate",
    "in_scope",
    "rewrite",
    "run_validations",
    "signature",
]
