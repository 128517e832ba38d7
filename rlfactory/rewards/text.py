"""Text helpers for rewards: answer normalisation and matching, number parsing, answer extraction.

`normalize_answer` is Search-R1's (itself SQuAD's): lowercase, drop punctuation, drop the
articles a/an/the, collapse whitespace, in that order. Extractors read a `Trajectory`:
`.model_text()`, `.segments` (with `.role`, `.text`) and `.info` (the dataset row).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Any, Callable, Iterable

from rlfactory.config import ConfigError
from rlfactory.imports import import_ref
from rlfactory.trajectory import Trajectory

AnswerExtractor = Callable[[Trajectory], "str | None"]

_PUNCT = set(string.punctuation)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def normalize_answer(s: str) -> str:
    """Search-R1 / SQuAD normalisation: lower, remove punctuation, articles, extra whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str | None, references: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals any normalised reference (Search-R1 `em_check`)."""
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return 1.0 if any(p == normalize_answer(r) for r in references) else 0.0


def substring_match(prediction: str | None, references: Iterable[str]) -> float:
    """1.0 when a normalised reference occurs inside the normalised prediction (Search-R1 `subem_check`)."""
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return 1.0 if any(normalize_answer(r) in p for r in references) else 0.0


def token_f1(prediction: str | None, references: Iterable[str]) -> float:
    """Best SQuAD token F1 of the prediction against the references (normalised tokens)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    best = 0.0
    for ref in references:
        gold = normalize_answer(ref).split()
        same = sum((Counter(pred) & Counter(gold)).values())
        if same == 0:
            continue
        precision, recall = same / len(pred), same / len(gold)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")
_FRACTION = re.compile(r"^([-+]?\d+)\s*/\s*(\d+)$")


def _to_float(token: str) -> float | None:
    try:
        return float(token.replace(",", ""))
    except ValueError:
        return None


def parse_number(text: str | None) -> float | None:
    """A number from free text, tolerantly: "1,234" -> 1234, "3.50" -> 3.5, "$1,234.00", "50%" -> 50,
    "1/2" -> 0.5, "1e3" -> 1000, "\\boxed{42}" -> 42; otherwise the last number in the text
    ("The answer is 42." -> 42). None when there is no number.
    """
    if text is None:
        return None
    s = text.strip()
    s = re.sub(r"\\boxed\{(.*)\}", r"\1", s)
    s = re.sub(r"\\(?:text|mathrm)\{[^}]*\}|\\[,!;: ]|\\%", " ", s).strip()
    core = re.sub(r"^[\s$€£¥]+|[\s%.$€£¥]+$", "", s).replace(" ", "")
    m = _FRACTION.match(core)
    if m:
        return int(m.group(1)) / int(m.group(2)) if int(m.group(2)) else None
    if _NUMBER.fullmatch(core):
        return _to_float(core)
    found = _NUMBER.findall(s)
    return _to_float(found[-1]) if found else None


def numbers_equal(a: float | None, b: float | None, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


# --- answer extraction -------------------------------------------------------------------------


def last_enclosed(text: str, opening: str, closing: str, after_opening: re.Pattern[str] | None = None) -> str | None:
    """What the last `opening ... closing` pair of `text` encloses, the pairs taken left to right
    as a non-greedy regex would (`re.findall(opening + after_opening + "(.*?)" + closing)[-1]`),
    or None. Linear in len(text): the scan stops at the first opening with no closing after it
    (the regex would retry every later opening, quadratic on many unclosed tags).
    `after_opening` must match right after `opening` for it to count (e.g. a code fence's language)."""
    pos, last = 0, None
    while (i := text.find(opening, pos)) >= 0:
        start = i + len(opening)
        if after_opening is not None:
            m = after_opening.match(text, start)
            if m is None:
                pos = i + 1
                continue
            start = m.end()
        j = text.find(closing, start)
        if j < 0:
            break
        last, pos = text[start:j], j + len(closing)
    return last


def tagged_answer(tag: str = "answer") -> AnswerExtractor:
    """Extractor: the content of the last `<tag>...</tag>` in the model's text (stripped), or None."""
    opening, closing = f"<{tag}>", f"</{tag}>"

    def extract(trajectory: Trajectory) -> str | None:
        found = last_enclosed(trajectory.model_text(), opening, closing)
        return found.strip() if found is not None else None

    extract.__name__ = f"tagged_answer_{tag}"
    return extract


def boxed_answer(trajectory: Trajectory) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces allowed) in the model's text, or None."""
    text = trajectory.model_text()
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def last_turn_answer(trajectory: Trajectory) -> str | None:
    """The last model turn's text without `<think>` blocks (for families whose answer is plain text)."""
    turns = [s.text for s in trajectory.segments if s.role == "model"]
    if not turns:
        return None
    text = _THINK.sub("", turns[-1]).strip()
    return text or None


def code_block(lang: str | None = None) -> AnswerExtractor:
    """Extractor: the last fenced code block (```lang ... ```) of the model's text, or None."""
    tag = re.escape(lang) if lang else r"[\w+-]*"
    opener = re.compile(rf"{tag}[ \t]*\n")  # what follows the fence's backticks up to its newline

    def extract(trajectory: Trajectory) -> str | None:
        found = last_enclosed(trajectory.model_text(), "```", "```", opener)
        return found.strip() if found is not None else None

    extract.__name__ = f"code_block_{lang or 'any'}"
    return extract


def answer_extractor(spec: str | AnswerExtractor, key: str = "reward.answer") -> AnswerExtractor:
    """An extractor from a spec: "tag:NAME", "boxed", "last_turn", "code" / "code:LANG", "module:fn"
    (`key`: the config key that gave it, for errors)."""
    if callable(spec):
        return spec
    if spec.startswith("tag:"):
        return tagged_answer(spec[4:])
    if spec == "boxed":
        return boxed_answer
    if spec == "last_turn":
        return last_turn_answer
    if spec == "code" or spec.startswith("code:"):
        return code_block(spec[5:] or None)
    if ":" in spec:
        return import_ref(spec, key, "function")
    raise ConfigError(f"{key}: unknown answer extractor {spec!r}: use tag:NAME, boxed, last_turn, code[:LANG] "
                      "or module:fn")


# --- dataset row fields --------------------------------------------------------------------------

REFERENCE_KEYS = ("ground_truth", "answer", "answers", "golden_answers", "target", "reference")


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):
        return _as_list(value.get("target", value.get("answer")))
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v is not None]
    return [str(value)]


def references_of(trajectory: Trajectory) -> list[str]:
    """Acceptable answers from the row: the first of info["ground_truth"], ["answer"], ["answers"],
    ["golden_answers"], ["target"], ["reference"], or ["reward_model"]["ground_truth"] (verl /
    Search-R1 rows); a str becomes a one-item list, a {"target": [...]} dict its target list.
    """
    info = trajectory.info
    for key in REFERENCE_KEYS:
        if key in info and info[key] is not None:
            return _as_list(info[key])
    rm = info.get("reward_model")
    if isinstance(rm, dict):
        return _as_list(rm.get("ground_truth"))
    return []


def question_of(trajectory: Trajectory) -> str:
    """The question: info["question"] / ["problem"] / ["query"] / ["prompt"] (last user message of a
    message list), else the text of the prompt segment."""
    info = trajectory.info
    for key in ("question", "problem", "query", "prompt"):
        value = info.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, list):
            users = [m.get("content", "") for m in value if isinstance(m, dict) and m.get("role") == "user"]
            if users:
                return str(users[-1])
    prompts = [s.text for s in trajectory.segments if s.role == "prompt"]
    return prompts[0] if prompts else ""
