"""Values that cross between the judge and the solution's session: `_lc_encode` / `_lc_decode` (standard library only).

The verification of a LeetCode/HumanEval attempt runs in two processes: the solution's session (the agent's code,
hostile by default) and a judge that never runs agent code. Only data crosses, as JSON made by this codec:
arguments from the judge to the solution, results back. Decoding builds plain values (None, bool, int, float, str,
bytes, list, tuple, dict, set, frozenset) and instances of the judge's own classes (TreeNode, ListNode, Node, ...)
by class name, so nothing the solution defines (a class overriding `__eq__`, an `int` subclass, a patched
`json`) ever runs in the judge: the verdict is computed there, on the judge's own objects.

Encoding: JSON scalars stand for themselves, a JSON list is a list, and every JSON object has one key naming its
type: `{"t": [...]}` tuple, `{"s": [...]}` set, `{"f": [...]}` frozenset, `{"d": [[k, v], ...]}` dict (any
hashable keys), `{"b": "<hex>"}` bytes, `{"o": i}` the i-th object of the object table, `{"S": 0}` the class under
test (the judge's stand-in for `Solution` in test cases). An encoded value is `{"v": <value>, "o": [[class name,
{attribute: value}], ...]}`; objects are numbered by identity, so shared nodes and cycles survive the trip.
`collections.Counter`/`OrderedDict`/`defaultdict` travel as dicts and `deque` as a list (LeetCode's JSON does the
same); any other type is refused with the name of the type.

Sandbox payload: `rltldr_jax.envs.leetcode` sends the code after this docstring to both processes (the solution's
preamble and the judge program).
"""

import collections as _lc_codec_collections


class _LcRefused(Exception):
    """A value that cannot cross: its type names the problem (`str(e)` is the type's name or what is wrong)."""


_LC_DICTS = (dict, _lc_codec_collections.Counter, _lc_codec_collections.OrderedDict, _lc_codec_collections.defaultdict)


def _lc_encode(value, solution=None, budget=2000000):
    """`value` as a JSON-ready tree `{"v": ..., "o": [...]}`; raises _LcRefused for a type that cannot cross."""
    objects, ids, pending, left = [], {}, [], [budget]

    def enc(x):
        left[0] -= 1
        if left[0] < 0:
            raise _LcRefused(f"a value with more than {budget} parts")
        t = type(x)
        if x is None or t is bool or t is int or t is str or t is float:
            return x
        if t is list or t is _lc_codec_collections.deque:
            return [enc(v) for v in x]
        if t is tuple:
            return {"t": [enc(v) for v in x]}
        if t is set:
            return {"s": [enc(v) for v in x]}
        if t is frozenset:
            return {"f": [enc(v) for v in x]}
        if t in _LC_DICTS:
            return {"d": [[enc(k), enc(v)] for k, v in x.items()]}
        if t is bytes:
            return {"b": x.hex()}
        if solution is not None and x is solution:
            return {"S": 0}
        attrs = getattr(x, "__dict__", None)
        if type(attrs) is not dict or not isinstance(t, type) or t.__module__ == "builtins":
            raise _LcRefused(getattr(t, "__name__", "?"))
        index = ids.get(id(x))
        if index is None:
            index = ids[id(x)] = len(objects)
            objects.append(None)
            pending.append((index, x, attrs))
        return {"o": index}

    tree = enc(value)
    while pending:
        index, obj, attrs = pending.pop()
        objects[index] = [type(obj).__name__, {k: enc(v) for k, v in list(attrs.items()) if type(k) is str}]
    return {"v": tree, "o": objects}


def _lc_decode(data, classes, solution=None):
    """The value of an encoded tree, built from plain types and `classes` (name -> class) only.

    Raises _LcRefused naming the problem for anything else: an unknown class, a malformed tree, unhashable set
    members or dict keys, `{"S": 0}` where no `solution` is given."""
    if type(data) is not dict or type(data.get("o")) is not list:
        raise _LcRefused("a malformed value")
    table = data["o"]
    made = []
    for entry in table:
        if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str or type(entry[1]) is not dict:
            raise _LcRefused("a malformed object")
        cls = classes.get(entry[0])
        if cls is None:
            raise _LcRefused(entry[0])
        made.append(object.__new__(cls))

    def dec(x):
        t = type(x)
        if x is None or t is bool or t is int or t is str or t is float:
            return x
        if t is list:
            return [dec(v) for v in x]
        if t is not dict or len(x) != 1:
            raise _LcRefused("a malformed value")
        ((tag, v),) = x.items()
        try:
            if tag == "t" and type(v) is list:
                return tuple(dec(i) for i in v)
            if tag == "s" and type(v) is list:
                return {dec(i) for i in v}
            if tag == "f" and type(v) is list:
                return frozenset(dec(i) for i in v)
            if tag == "d" and type(v) is list:
                out = {}
                for pair in v:
                    if type(pair) is not list or len(pair) != 2:
                        raise _LcRefused("a malformed dict")
                    out[dec(pair[0])] = dec(pair[1])
                return out
            if tag == "b" and type(v) is str:
                return bytes.fromhex(v)
        except TypeError:
            raise _LcRefused("an unhashable set member or dict key") from None
        except ValueError:
            raise _LcRefused("malformed bytes") from None
        if tag == "o" and type(v) is int and 0 <= v < len(made):
            return made[v]
        if tag == "S" and solution is not None:
            return solution
        raise _LcRefused("a malformed value")

    for obj, (_, attrs) in zip(made, table):
        for key, value in attrs.items():
            obj.__dict__[key] = dec(value)
    return dec(data["v"])


def _lc_strict_mismatch(got, expected):
    """Why `got` equals `expected` only by Python's `==` (None when the types agree too): a bool is not a number
    (`True == 1`), a tuple not a list, a set not a frozenset is fine; ints and floats stand for each other."""
    stack = [(got, expected)]
    while stack:
        g, e = stack.pop()
        tg, te = type(g), type(e)
        if tg is bool or te is bool:
            if tg is not te:
                return f"got {tg.__name__} where {te.__name__} was expected"
            continue
        if tg in (int, float) and te in (int, float):
            continue
        if tg in (list, tuple) and tg is te and len(g) == len(e):
            stack.extend(zip(g, e))
        elif tg is dict and te is dict:
            stack.extend((g[k], e[k]) for k in e if k in g)
            bool_keys = {(type(k) is bool, k) for k in g} != {(type(k) is bool, k) for k in e}
            if bool_keys:
                return "got bool keys where numbers were expected, or the other way round"
        elif tg in (set, frozenset) and te in (set, frozenset):
            if {(type(k) is bool, k) for k in g} != {(type(k) is bool, k) for k in e}:
                return "got bool members where numbers were expected, or the other way round"
    return None
