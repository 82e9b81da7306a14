# ruff: noqa: E401
"""The test runner that verifies an attempt inside the sandbox: `__lc_harness(plan_json, marker)`.

Sandbox payload: `rltldr_jax.envs.leetcode.harness_code` reads this file as text and sends the code after this
docstring to the sandbox after the agent's code, followed by a call `__lc_harness(<plan JSON>, <marker>)` and
`del __lc_harness`. It runs in the agent's namespace (its `globals()`), so the solution class or function under
test is looked up there. It builds a fresh judge namespace from the plan's `judge_src` (fresh copies of the helper
classes of `nodes.py`), runs every test case under a guard (exceptions, `SystemExit` and prints contained per
case; a per-case SIGALRM timer and an overall deadline), refuses results that hold objects of agent-defined types
overriding `__eq__`, and prints exactly one line `<marker> <json>` with the statuses (P passed, F wrong answer,
E error, T time limit, S not run) and up to `max_details` failure details; `parse_result` in the parent reads it.
"""

def __lc_harness(__lc_plan_json, __lc_marker):
    import builtins, collections, decimal, fractions, io, json, signal, sys, time
    plan = json.loads(__lc_plan_json)
    G = globals()
    here = sys._getframe().f_code.co_filename
    out = sys.stdout
    max_repr, max_details = plan["max_repr"], plan["max_details"]
    deadline = time.monotonic() + plan["total_timeout"]
    statuses, details, setup_error = [], [], None

    class TLE(BaseException):
        pass

    def on_alarm(signum, frame):
        raise TLE()

    try:
        signal.signal(signal.SIGALRM, on_alarm)
        can_alarm = True
    except Exception:
        can_alarm = False

    def arm(seconds):
        if can_alarm:
            signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001), 0.1)

    def disarm():
        if can_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)

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
        tb, line = e.__traceback__, None
        while tb is not None:
            line = tb.tb_lineno if tb.tb_frame.f_code.co_filename not in ("<judge>", here) else None
            tb = tb.tb_next
        if line is not None:
            text += " (line %d of your code)" % line
        return text if len(text) <= max_repr else text[: max_repr - 3] + "..."

    safe_types = {int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset, range,
                  collections.Counter, collections.defaultdict, collections.OrderedDict, collections.deque,
                  fractions.Fraction, decimal.Decimal}

    def code_key(c):
        return (c.co_code, c.co_names, tuple(code_key(k) if hasattr(k, "co_code") else k for k in c.co_consts))

    def methods(t):
        out = {}
        for k, v in vars(t).items():
            f = getattr(v, "__func__", v)
            if hasattr(f, "__code__"):
                out[k] = code_key(f.__code__)
            elif not (isinstance(v, (str, type(None))) or k in ("__dict__", "__weakref__")):
                out[k] = type(v).__name__
        return out

    def same_class(t, fresh):
        try:
            return (methods(t) == methods(fresh) and len(t.__bases__) == len(fresh.__bases__)
                    and all(b is fb or same_class(b, fb) for b, fb in zip(t.__bases__, fresh.__bases__)))
        except Exception:
            return False

    def plain(t):
        return all(b is object or (b.__eq__ is object.__eq__ and b.__ne__ is object.__ne__
                                   and type(b) is type and b.__module__ != "builtins") for b in t.__mro__)

    def forged(x):
        """The name of a type in x that could fake equality (None when x is plain data)."""
        stack, seen, budget = [x], set(), 200000
        while stack and budget > 0:
            o = stack.pop()
            if id(o) in seen:
                continue
            seen.add(id(o))
            budget -= 1
            t = type(o)
            if t in safe_types:
                if t in (list, tuple, set, frozenset, collections.deque):
                    stack.extend(o)
                elif isinstance(o, dict):
                    stack.extend(o.keys())
                    stack.extend(o.values())
                continue
            fresh = fresh_classes.get(getattr(t, "__name__", None))
            if t is fresh or plain(t) or (fresh is not None and same_class(t, fresh)):
                d = getattr(o, "__dict__", None)
                if type(d) is dict:
                    stack.extend(d.values())
                continue
            return getattr(t, "__name__", "?")
        return None

    def run_guarded(fn, args, timeout):
        """(status, value, exception): status P (returned), E (raised), T (timed out)."""
        sink = io.StringIO()
        so, se = sys.stdout, sys.stderr
        try:
            try:
                sys.stdout = sys.stderr = sink
                arm(timeout)
                try:
                    value = fn(*args)
                finally:
                    disarm()
                return "P", value, None
            except TLE:
                disarm()
                return "T", None, None
            except BaseException as e:
                disarm()
                return "E", None, e
        except TLE:
            disarm()
            return "T", None, None
        finally:
            sys.stdout, sys.stderr = so, se

    def record(status, **detail):
        statuses.append(status)
        if status != "P" and len(details) < max_details:
            details.append(dict(detail, i=len(statuses) - 1, s=status))

    judge = {"__name__": "__lc_judge__", "__builtins__": builtins}
    fresh_classes = {}
    target = G.get(plan["target"])
    try:
        exec(compile(plan["judge_src"], "<judge>", "exec"), judge)
        fresh_classes = {k: v for k, v in judge.items() if isinstance(v, type)}
    except BaseException as e:
        setup_error = "judge setup failed: " + describe(e)
    if setup_error is None and target is None:
        setup_error = "`%s` is not defined: your code must define it" % plan["target"]

    class ModuleProxy:
        def __setattr__(self, name, value):
            G[name] = value

        def __getattr__(self, name):
            return G[name]

    class Param:
        def __init__(self, *values, **kwargs):
            self.values = values

    class PytestStub:
        param = Param

    if setup_error is None and plan["mode"] == "leetcode":
        judge[plan["target"]] = target
        judge["Solution"] = target
        judge["solution_module"] = ModuleProxy()
        judge["pytest"] = PytestStub
        for test in plan["tests"]:
            fn, params = judge[test["fn"]], test["params"]
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
                status, value, exc = run_guarded(fn, args, timeout)
                if status == "T":
                    record("T", input=shown, expected=expected,
                           error="time limit exceeded (%.1f s)" % plan["case_timeout"])
                elif status == "P":
                    result = value.get("result") if isinstance(value, dict) else None
                    bad = forged(result)
                    if bad is None:
                        record("P")
                    else:
                        record("F", input=shown, got=show(result), expected=expected,
                               error="the result holds a %s object; return plain values" % bad)
                else:
                    tb, result, has_result = exc.__traceback__, None, False
                    while tb is not None:
                        if tb.tb_frame.f_code is fn.__code__ and "result" in tb.tb_frame.f_locals:
                            result, has_result = tb.tb_frame.f_locals["result"], True
                        tb = tb.tb_next
                    if isinstance(exc, AssertionError) and has_result:
                        record("F", input=shown, got=show(result), expected=expected)
                    else:
                        record("E", input=shown, expected=expected, error=describe(exc))

    if setup_error is None and plan["mode"] == "humaneval":
        n = plan["num_tests"]
        case_status = [None] * n
        case_detail = [None] * n

        def case(i, src, left, right, got):
            if case_status[i] not in (None, "P"):
                return
            try:
                if right is not None:
                    g = left()
                    e = right()
                    ok = bool(g == e)
                    bad = forged(g) if ok else None
                    if bad is not None:
                        ok = False
                    info = dict(input=src, got=show(g), expected=show(e))
                    if bad is not None:
                        info["error"] = "the result holds a %s object; return plain values" % bad
                else:
                    ok = bool(left())
                    g = got() if got is not None else None
                    bad = forged(g) if ok else None
                    if bad is not None:
                        ok = False
                    info = dict(input=src, got=show(g) if got is not None else None, expected="the assertion holds")
                case_status[i] = "P" if ok else "F"
                if not ok and case_detail[i] is None:
                    case_detail[i] = info
            except TLE:
                raise
            except BaseException as e:
                case_status[i] = "E"
                case_detail[i] = dict(input=src, error=describe(e))

        judge["__lc_case"] = case
        judge[plan["target"]] = target
        status, value, exc = run_guarded(judge["check"], (target,), deadline - time.monotonic())
        first_missing = True
        for i in range(n):
            if case_status[i] is None:
                if first_missing and status == "T":
                    case_status[i], case_detail[i] = "T", dict(error="time limit exceeded (%.1f s in all)" % plan["total_timeout"])
                elif first_missing and status == "E":
                    case_status[i], case_detail[i] = "E", dict(error="check() stopped: " + describe(exc))
                else:
                    case_status[i] = "S"
                first_missing = False
            record(case_status[i], **(case_detail[i] or {}))

    payload = {"n": len(statuses), "statuses": "".join(statuses), "details": details, "setup_error": setup_error}
    out.write("\n" + __lc_marker + " " + json.dumps(payload) + "\n")
    out.flush()
