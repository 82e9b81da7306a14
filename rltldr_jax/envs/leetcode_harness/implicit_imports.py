# The names are imported for the agent code that runs after this one, in the same namespace.
# ruff: noqa: E401, F401
"""LeetCode's implicit imports: the judge makes these modules and names available without an import, so the
agent's code may use them as they are (`List`, `Optional`, `deque`, `heappush`, `lru_cache`, ...).

Sandbox payload, not an import-time dependency: `rltldr_jax.envs.leetcode` reads this file as text and sends the
code after this docstring to the sandbox, where it runs before the agent's code (the preamble).
"""

import bisect, collections, copy, functools, heapq, itertools, math, operator, random, re, string
from bisect import bisect_left, bisect_right, insort
from collections import Counter, OrderedDict, defaultdict, deque
from functools import cache, lru_cache, reduce
from heapq import heapify, heappop, heappush, heappushpop, heapreplace, nlargest, nsmallest
from itertools import accumulate, combinations, permutations, product
from math import comb, gcd, inf, isqrt, sqrt
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union
