"""Valid Unicode text at the boundaries where outside text meets a tokenizer or a UTF-8 encoder.

A Python `str` may hold code points no encoder accepts: unpaired surrogates (U+D800-U+DFFF), which
JSON lets a tool, a server or a dataset row write as `"\\ud800"` (half of an emoji cut in two is
enough). Hugging Face tokenizers refuse such a string with a `TypeError`, and `str.encode()` with
a `UnicodeEncodeError`, so one of them in a tool result or a prompt would fail whatever encodes it.
`valid_text` replaces each one with U+FFFD (the replacement character) and says how many it
replaced; a surrogate pair written as two code points becomes the character it stands for. NUL and
other control characters are valid text and stay. Bytes are decoded as UTF-8, each invalid
sequence becoming U+FFFD. Cheap on valid text: one C-level check, no copy.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


def valid_text(text: Any) -> tuple[str, int]:
    """(`text` as valid Unicode, how many characters were replaced). `bytes` are decoded as UTF-8;
    anything else that is not a `str` (None, a number) becomes `str(text)`, nothing replaced."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        out = raw.decode("utf-8", "replace")
        return out, out.count(REPLACEMENT) - raw.count(REPLACEMENT.encode())
    if not isinstance(text, str):
        return ("" if text is None else str(text)), 0
    if text.isascii():
        return text, 0
    try:
        text.encode("utf-8")
        return text, 0
    except UnicodeEncodeError:
        pass
    # UTF-16 with surrogatepass joins each pair into its character; a lone half cannot be decoded
    # and becomes U+FFFD.
    out = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return out, out.count(REPLACEMENT) - text.count(REPLACEMENT)


def valid_strings(value: Any) -> tuple[Any, int]:
    """`value` (JSON-like: dicts, lists, strings, scalars) with every string, keys included, made
    valid by `valid_text`, and how many characters were replaced. Containers are repaired in place
    (a string on its own comes back new). Iterative, so any depth is fine."""
    replaced = 0

    def fix(s: str) -> str:
        nonlocal replaced
        out, n = valid_text(s)
        replaced += n
        return out

    if isinstance(value, str):
        return fix(value), replaced
    if not isinstance(value, (dict, list)):
        return value, 0
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]  # (container, key) of each node still to visit
    while stack:
        parent, key = stack.pop()
        node = parent[key]
        if isinstance(node, str):
            fixed = fix(node)
            if fixed is not node:
                parent[key] = fixed
        elif isinstance(node, list):
            stack.extend((node, i) for i in range(len(node)))
        elif isinstance(node, dict):
            if not all(isinstance(k, str) and valid_text(k)[1] == 0 for k in node):
                items = [(fix(k) if isinstance(k, str) else k, v) for k, v in node.items()]
                node.clear()
                node.update(items)
            stack.extend((node, k) for k in node)
    return root[0], replaced


def nesting_depth(value: Any) -> int:
    """Depth of nested lists/dicts (a scalar is 0, `{}` is 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def has_invalid_text(value: Any) -> bool:
    """Whether any string (or key) in `value` holds a code point no UTF-8 encoder accepts."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if not node.isascii() and not _encodes(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
