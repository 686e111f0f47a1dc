"""Reading YAML that a user wrote: safe, strict about repeated keys, and bounded.

YAML's aliases (``*name``) repeat an anchored node without copying it: nine levels of nine
aliases each are a 1 KB file whose data, once anything walks or copies it (merging, printing the
config, passing keyword arguments), is 9**9 values. A document is measured as it would be
expanded, before any Python object is built, and refused beyond ``MAX_NODES`` nodes (an EasyR1
config has a few hundred), as is an alias that contains itself (infinitely large), and nesting
deeper than ``MAX_DEPTH`` (which the recursive code that copies, merges and prints a config would
not survive).
"""

from __future__ import annotations

from typing import IO, Any

import yaml

MAX_NODES = (
    100_000  # expanded: a config's few hundred nodes, or a reward's kwargs of long lists, fit many times
)
MAX_DEPTH = 100  # a config nests 4 levels, a reward's kwargs a few more


class YAMLTooLarge(yaml.MarkedYAMLError):
    """A document whose aliases expand beyond ``MAX_NODES`` nodes or into themselves, or that nests
    deeper than ``MAX_DEPTH``."""


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last: a second
    ``trainer:`` block would silently drop the first one's keys) and a document too large expanded."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_size(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *anchor``: keys written beside it override the merged ones
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_size(root: yaml.Node) -> None:
    """Count the nodes of ``root`` as if every alias were a copy, each shared node once (so in time
    linear in the file), and without recursion (a deep document would exhaust Python's stack)."""
    size: dict[int, int] = {}  # id(node) -> its expanded size, once known
    depth: dict[int, int] = {}  # id(node) -> the levels below it, itself included
    open_nodes: set[int] = set()  # on the current path: met again below itself, an alias loops
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            children = _children(node)
            size[key] = total = 1 + sum(size[id(child)] for child in children)
            depth[key] = levels = 1 + max((depth[id(child)] for child in children), default=0)
            if total > MAX_NODES:
                raise YAMLTooLarge(
                    None,
                    None,
                    f"its aliases expand to more than {MAX_NODES} values (a YAML alias bomb?)",
                    node.start_mark,
                )
            if levels > MAX_DEPTH:
                raise YAMLTooLarge(None, None, f"it nests deeper than {MAX_DEPTH} levels", node.start_mark)
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise YAMLTooLarge(
                None, None, "an alias contains itself (infinitely large once expanded)", node.start_mark
            )
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)


def load(stream: str | bytes | IO[Any]) -> Any:
    """The one document of ``stream`` (None when empty); ``yaml.YAMLError`` (``YAMLTooLarge``
    included) for what cannot be read, and ``RecursionError`` is one too (nesting deeper than
    PyYAML's recursive reader goes)."""
    try:
        return yaml.load(stream, Loader=_Loader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to read") from None
