"""The solution side of a verification: `_lc_serve(request_json) -> reply_json`, in the agent's session.

Sandbox payload: `rltldr_jax.envs.leetcode` sends the code after this docstring to the solution's session in its
preamble (after `codec`), before the agent's code. The judge process (`runner`) reaches it through the trainer,
which relays each request with `Sandbox.call("_lc_serve", request, timeout)`. Requests:

- `{"op": "setup", "target", "src"}`: builds a fresh namespace from `src` (the problem's helper code and the run
  functions `__lc_run_<k>`: the first statement of each test, which calls the solution) with the agent's `target`
  (its `Solution`, design class or HumanEval function) in it. Reply `{"ok": true}` or `{"error": ...}`.
- `{"op": "call", "fn", "args", "timeout"}`: calls `fn` of that namespace with the decoded arguments under a SIGALRM
  timer, prints swallowed. Reply `{"ok": true, "value": <encoded result>}`, `{"error": <exception, with the line of
  the agent's code>}`, `{"timeout": true}` or `{"refused": <type name>}` (a result that cannot cross).

Everything here runs beside the agent's code, which may rewrite any of it: the judge treats a reply as the agent's
answer, never as a verdict (it compares the decoded answer with the expected values itself, which never come here).
"""


def _lc_solution_server(agent_globals):
    import builtins
    import io
    import json
    import signal
    import sys

    state = {}

    class TLE(BaseException):
        pass

    def on_alarm(signum, frame):
        raise TLE()

    def describe(e):
        text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        tb, line = e.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename.startswith("<agent"):
                line = tb.tb_lineno
            tb = tb.tb_next
        if line is not None:
            text += f" (line {line} of your code)"
        return text if len(text) <= 300 else text[:297] + "..."

    class ModuleProxy:
        """`solution_module` of the package's helpers: the agent's globals."""

        def __setattr__(self, name, value):
            agent_globals[name] = value

        def __getattr__(self, name):
            return agent_globals[name]

    class Param:
        def __init__(self, *values, **kwargs):
            self.values = values

    class PytestStub:
        param = Param

    def setup(request):
        target = agent_globals.get(request["target"])
        if target is None:
            return {"error": f"`{request['target']}` is not defined: your code must define it"}
        ns = {"__name__": "__lc_solution__", "__builtins__": builtins, "solution_module": ModuleProxy()}
        ns["pytest"] = PytestStub
        exec(compile(request["src"], "<judge>", "exec"), ns)
        ns[request["target"]] = ns["Solution"] = target
        state["ns"], state["target"] = ns, target
        return {"ok": True}

    def call(request):
        if "ns" not in state:
            return {"error": "the judge asked for a call before its setup"}
        args = _lc_decode(request["args"], {}, solution=state["target"])
        fn = state["ns"][request["fn"]]
        so, se = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = io.StringIO()
        try:
            try:
                signal.signal(signal.SIGALRM, on_alarm)
                signal.setitimer(signal.ITIMER_REAL, max(float(request["timeout"]), 0.001), 0.1)
                try:
                    value = fn(*args[0], **args[1])
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except TLE:
                return {"timeout": True}
            except BaseException as e:
                return {"error": describe(e)}
            try:
                return {"ok": True, "value": _lc_encode(value)}
            except _LcRefused as e:
                return {"refused": str(e)}
        except TLE:
            return {"timeout": True}
        finally:
            sys.stdout, sys.stderr = so, se

    def serve(request_json):
        try:
            request = json.loads(request_json)
            reply = setup(request) if request["op"] == "setup" else call(request)
            return json.dumps(reply)
        except BaseException as e:
            return json.dumps({"error": "the judge could not run your code: " + describe(e)})

    return serve


_lc_serve = _lc_solution_server(globals())
