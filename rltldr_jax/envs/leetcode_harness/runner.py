# ruff: noqa: E401
"""The judge of a verification: `__lc_harness(plan_json, marker)`, in a process that never runs agent code.

Sandbox payload: `rltldr_jax.envs.leetcode.harness_code` sends the code after this docstring (after `codec`) to the
judge's session, followed by a call `__lc_harness(<plan JSON>, <marker>)`. The judge builds its namespace from the
plan's `judge_src` (the problem's helper code, the judge's own helper classes, and per test a check function
`__lc_check_<k>(result, <params>)`: the test's statements after the one that calls the solution), evaluates each
test case itself, and asks the solution's session for the answer only: `apis.solution.call(request)` goes to the
trainer, which relays it to `_lc_serve` in the solution's session (see `server`) and returns
`{"reply": <the session's JSON>}`, `{"timeout": true}` (the session was stopped and primed again), `{"gone":
<why>}` (it died; primed again) or `{"late": true}` (the total time is spent). Only the arguments the calling
statement uses are sent (expected values stay here); the answer comes back as data (`codec`) and is checked here
by the problem's own assertion helpers, with the types checked too where the answer equals an expected value
(`True` is not `1`). HumanEval: `check(candidate)` runs here with `candidate` a stub that sends each call's
arguments to the solution and returns the decoded answer; each `assert` of `check` is its own test case.

It prints exactly one line `<marker> <json>` with the statuses (P passed, F wrong answer, E error, T time limit, S
not run) and up to `max_details` failure details; `parse_result` in the trainer reads it.
"""

def __lc_harness(__lc_plan_json, __lc_marker):
    import builtins, json, sys, time
    plan = json.loads(__lc_plan_json)
    out = sys.stdout
    max_repr, max_details = plan["max_repr"], plan["max_details"]
    deadline = time.monotonic() + plan["total_timeout"]
    statuses, details, setup_error = [], [], None
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    class SolutionRef:
        """The class under test as test cases name it (`Solution`); it travels as a reference, not as code."""

        def __repr__(self):
            return plan["target"]

    solution_ref = SolutionRef()

    class Unanswered(Exception):
        """The solution gave no usable answer: status T (time limit) or E (error)."""

        def __init__(self, status, message):
            Exception.__init__(self, message)
            self.status = status

    class Refused(Exception):
        """The answer holds a value that cannot be judged (a type the judge does not have)."""

    def show(x):
        try:
            if hasattr(x, "val") and hasattr(x, "left") and hasattr(x, "right"):
                text = "TreeNode(%r)" % (judge["_lc_tree_list"](x),)
            elif hasattr(x, "val") and hasattr(x, "next") and not hasattr(x, "random"):
                values, cyclic = judge["_lc_chain"](x)
                text = "ListNode(%r%s)" % (values, " + cycle" if cyclic else "")
            else:
                text = repr(x)
        except BaseException as e:
            text = "<unprintable %s: %s>" % (type(x).__name__, type(e).__name__)
        text = str(text)
        return text if len(text) <= max_repr else text[: max_repr - 3] + "..."

    def describe(e):
        text = "%s: %s" % (type(e).__name__, e) if str(e) else type(e).__name__
        return text if len(text) <= max_repr else text[: max_repr - 3] + "..."

    def ask(request, timeout):
        """The solution session's reply (a dict) to one request, via the trainer's relay."""
        request["timeout"] = timeout
        relayed = apis.solution.call(json.dumps(request))
        if relayed.get("late"):
            raise Unanswered("S", "not run (time limit)")
        if relayed.get("timeout"):
            raise Unanswered("T", "time limit exceeded (%.1f s)" % timeout)
        if "gone" in relayed:
            raise Unanswered("E", str(relayed["gone"])[:max_repr])
        try:
            reply = json.loads(relayed["reply"])
        except (KeyError, TypeError, ValueError, RecursionError):
            raise Unanswered("E", "the solution's session sent no readable answer") from None
        if type(reply) is not dict:
            raise Unanswered("E", "the solution's session sent no readable answer")
        if reply.get("timeout") is True:
            raise Unanswered("T", "time limit exceeded (%.1f s)" % timeout)
        if "error" in reply:
            raise Unanswered("E", str(reply["error"])[:max_repr])
        if "refused" in reply:
            raise Refused("the result holds a %s object; return plain values" % str(reply["refused"])[:80])
        return reply

    def solve(fn, args, kwargs, timeout):
        """The solution's answer to `fn(*args, **kwargs)`, decoded into the judge's own types."""
        reply = ask({"op": "call", "fn": fn, "args": _lc_encode([list(args), kwargs], solution_ref)}, timeout)
        try:
            return _lc_decode(reply.get("value"), classes)
        except _LcRefused as e:
            raise Refused("the result holds a %s object; return plain values" % str(e)[:80]) from None
        except RecursionError:
            raise Refused("the result nests too deeply to be judged") from None

    def record(status, **detail):
        statuses.append(status)
        if status != "P" and len(details) < max_details:
            details.append(dict(detail, i=len(statuses) - 1, s=status))

    class Param:
        def __init__(self, *values, **kwargs):
            self.values = values

    class PytestStub:
        param = Param

    judge = {"__name__": "__lc_judge__", "__builtins__": builtins, "pytest": PytestStub}
    classes = {}
    try:
        exec(compile(plan["judge_src"], "<judge>", "exec"), judge)
        classes = {k: v for k, v in judge.items() if isinstance(v, type) and not k.startswith("__")}
        judge[plan["target"]] = judge["Solution"] = solution_ref
    except BaseException as e:
        setup_error = "judge setup failed: " + describe(e)
    if setup_error is None:
        try:
            ask({"op": "setup", "target": plan["target"], "src": plan["solution_src"]}, plan["case_timeout"])
        except (Unanswered, Refused) as e:
            setup_error = str(e)

    if setup_error is None and plan["mode"] == "leetcode":
        for test in plan["tests"]:
            check, params = judge[test["check"]], test["params"]
            for case_src in test["cases"]:
                if time.monotonic() >= deadline:
                    record("S")
                    continue
                try:
                    value = eval(case_src, judge)
                    if isinstance(value, Param):
                        args = tuple(value.values)
                    elif len(params) == 1:
                        args = (value,)
                    else:
                        args = tuple(value)
                    named = dict(zip(params, args))
                    shown = ", ".join("%s = %s" % (k, show(v)) for k, v in named.items()
                                      if not k.startswith("expected") and k != "solution_class")
                    expected = [show(v) for k, v in named.items() if k.startswith("expected")]
                    expected = expected[0] if len(expected) == 1 else (", ".join(expected) or None)
                except BaseException as e:
                    record("E", input=case_src[:max_repr], error="bad test case: " + describe(e))
                    continue
                timeout = min(plan["case_timeout"], deadline - time.monotonic())
                try:
                    result = solve(test["run"], [named[p] for p in test["run_params"]], {}, timeout)
                except Unanswered as e:
                    if e.status == "S":
                        record("S")
                    else:
                        record(e.status, input=shown, expected=expected, error=str(e))
                    continue
                except Refused as e:
                    record("F", input=shown, expected=expected, error=str(e))
                    continue
                try:
                    check(result, **{k: v for k, v in named.items() if k != "result"})
                except AssertionError:
                    record("F", input=shown, got=show(result), expected=expected)
                    continue
                except BaseException as e:
                    record("E", input=shown, got=show(result), expected=expected, error=describe(e))
                    continue
                why = None
                for k, v in named.items():
                    if k.startswith("expected") and k not in test["run_params"] and why is None:
                        try:
                            why = _lc_strict_mismatch(result, v) if result == v else None
                        except BaseException:
                            why = None
                if why is None:
                    record("P")
                else:
                    record("F", input=shown, got=show(result), expected=expected, error=why)

    if setup_error is None and plan["mode"] == "humaneval":
        n = plan["num_tests"]
        case_status = [None] * n
        case_detail = [None] * n

        def candidate(*args, **kwargs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unanswered("S", "not run (time limit)")
            return solve(plan["target"], args, kwargs, left)

        def case(i, src, left, right, got):
            if case_status[i] not in (None, "P"):
                return
            try:
                if right is not None:
                    g = left()
                    e = right()
                    ok = bool(g == e)
                    info = dict(input=src, got=show(g), expected=show(e))
                    why = _lc_strict_mismatch(g, e) if ok else None
                    if why is not None:
                        ok = False
                        info["error"] = why
                else:
                    ok = bool(left())
                    g = got() if got is not None and not ok else None
                    info = dict(input=src, got=show(g) if got is not None else None, expected="the assertion holds")
                case_status[i] = "P" if ok else "F"
                if not ok and case_detail[i] is None:
                    case_detail[i] = info
            except Unanswered as e:
                case_status[i] = e.status
                case_detail[i] = dict(input=src, error=str(e))
            except Refused as e:
                case_status[i] = "F"
                case_detail[i] = dict(input=src, error=str(e))
            except BaseException as e:
                case_status[i] = "E"
                case_detail[i] = dict(input=src, error=describe(e))

        judge["__lc_case"] = case
        judge[plan["target"]] = candidate
        stopped = None
        try:
            judge["check"](candidate)
        except BaseException as e:
            stopped = e
        first_missing = True
        for i in range(n):
            if case_status[i] is None:
                if first_missing and stopped is not None and not isinstance(stopped, Unanswered):
                    case_status[i], case_detail[i] = "E", dict(error="check() stopped: " + describe(stopped))
                else:
                    case_status[i] = "S"
                first_missing = False
            record(case_status[i], **(case_detail[i] or {}))

    payload = {"n": len(statuses), "statuses": "".join(statuses), "details": details, "setup_error": setup_error}
    out.write("\n" + __lc_marker + " " + json.dumps(payload) + "\n")
    out.flush()
