"""A made-up knowledge world for the search env, deterministic by seed.

People (birthplace, birth year, employer), cities (country) and companies (founder, headquarters)
with short regular names; one passage per entity, written as plain sentences; single-hop
questions ("Where was Kalo Mire born?") and multi-hop ones that need a search per hop ("In which
country was Kalo Mire born?"). Train and test worlds have disjoint people, cities and companies
(only the few country names are shared), so test answers can only be found, never memorised.
The vocabulary is small and regular so that a tiny model trained for minutes can learn to copy
a name from the question into a query and an answer from a passage.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfactory.envs.data import qa_row, write_parquet
from rlfactory.envs.search.prompts import searchr1_prompt

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class Relation:
    """A fact kind: the question asking for it and the sentence pattern a passage states it with."""

    subject: str  # entity kind of the subject: person | city | company
    question: str  # "{x}" is the subject's name
    pattern: str  # regex over passage text; "{x}" is the escaped subject name, group 1 the value


RELATIONS: dict[str, Relation] = {
    "birthplace": Relation("person", "Where was {x} born?", r"{x} was born in (\w+)"),
    "birth_year": Relation("person", "When was {x} born?", r"{x} was born in \w+ in (\d+)"),
    "employer": Relation("person", "Who does {x} work for?", r"{x} works for (\w+)"),
    "country": Relation("city", "In which country is {x}?", r"{x} is a city in (\w+)"),
    "founder": Relation("company", "Who founded {x}?", r"{x} was founded by (\w+ \w+)"),
    "headquarters": Relation("company", "Where is {x} based?", r"{x} is based in (\w+)"),
}

# Multi-hop questions: the relation chain and the question. Each hop is one search.
CHAINS: dict[tuple[str, ...], str] = {
    ("birthplace", "country"): "In which country was {x} born?",
    ("employer", "founder"): "Who founded the company {x} works for?",
    ("employer", "headquarters"): "Where is the company {x} works for based?",
    ("employer", "headquarters", "country"): "In which country is the company {x} works for based?",
}


def find_fact(relation: str, subject: str, text: str) -> re.Match[str] | None:
    """Where `text` (e.g. search results) states `relation` for `subject`: group 1 is the value."""
    return re.search(RELATIONS[relation].pattern.replace("{x}", re.escape(subject)), text)


def extract_fact(relation: str, subject: str, text: str) -> str | None:
    """The value of `relation` for `subject` as stated in `text` (e.g. search results), or None."""
    m = find_fact(relation, subject, text)
    return m.group(1) if m else None


@dataclass
class Question:
    text: str
    answer: str
    subject: str
    relations: list[str]
    split: str

    @property
    def hops(self) -> int:
        return len(self.relations)


@dataclass
class World:
    seed: int
    countries: list[str]
    facts: dict[str, dict[str, str]]  # entity name -> {relation: value}
    kinds: dict[str, str]  # entity name -> person | city | company
    split_of: dict[str, str]  # entity name -> train | test
    passages: list[dict[str, str]]  # {"id", "contents"}; contents = "Title\ntext" (Search-R1 style)
    questions: dict[str, list[Question]] = field(default_factory=dict)

    def entities(self, split: str) -> list[str]:
        return [e for e, s in self.split_of.items() if s == split]

    def passage_of(self, entity: str) -> dict[str, str]:
        return next(p for p in self.passages if p["contents"].split("\n", 1)[0] == entity)

    def answer(self, subject: str, relations: list[str]) -> str:
        value = subject
        for rel in relations:
            value = self.facts[value][rel]
        return value


class Names:
    """Unique capitalised names made of consonant-vowel syllables; every word is used once."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int, coda: bool = False) -> str:
        for attempt in range(1000):
            n = syllables + attempt // 200  # grow when a length runs out
            w = "".join(self.rng.choice(_CONSONANTS) + self.rng.choice(_VOWELS) for _ in range(n))
            if coda:
                w += self.rng.choice("lnrs")
            if w not in self.used:
                self.used.add(w)
                return w.capitalize()
        raise RuntimeError("name space exhausted")


def _build_split(rng: random.Random, names: Names, n_people: int, countries: list[str], split: str,
                 world: World, n_cities: int, n_companies: int) -> None:
    cities = [names.word(2, coda=True) for _ in range(n_cities)]
    companies = [names.word(3) for _ in range(n_companies)]
    people = [f"{names.word(2)} {names.word(2)}" for _ in range(n_people)]
    for c in cities:
        world.facts[c] = {"country": rng.choice(countries)}
        world.kinds[c], world.split_of[c] = "city", split
    for p in people:
        world.facts[p] = {"birthplace": rng.choice(cities), "birth_year": str(rng.randint(1900, 1999))}
        world.kinds[p], world.split_of[p] = "person", split
    founders = rng.sample(people, k=min(len(people), len(companies)))
    for i, co in enumerate(companies):
        world.facts[co] = {"founder": founders[i % len(founders)], "headquarters": rng.choice(cities)}
        world.kinds[co], world.split_of[co] = "company", split
    for p in people:
        world.facts[p]["employer"] = rng.choice(companies)


def _passage_text(world: World, name: str) -> str:
    f = world.facts[name]
    kind = world.kinds[name]
    if kind == "person":
        return f"{name} was born in {f['birthplace']} in {f['birth_year']}. {name} works for {f['employer']}."
    if kind == "city":
        return f"{name} is a city in {f['country']}."
    return f"{name} was founded by {f['founder']}. {name} is based in {f['headquarters']}."


def make_world(
    seed: int = 0,
    n_train_entities: int = 200,
    n_test_entities: int = 50,
    *,
    n_countries: int = 5,
    city_ratio: float = 0.3,
    company_ratio: float = 0.3,
    max_hops: int = 2,
) -> World:
    """Generate a world. `n_*_entities` count the people of each split; each split also gets
    `ratio * people` cities and companies (at least 2). Questions: every single-hop fact of every
    entity, plus the multi-hop chains of at most `max_hops` hops for every person."""
    rng = random.Random(seed)
    names = Names(rng)
    countries = [names.word(3, coda=True) for _ in range(n_countries)]
    world = World(seed=seed, countries=countries, facts={}, kinds={}, split_of={}, passages=[])
    for split, n in (("train", n_train_entities), ("test", n_test_entities)):
        _build_split(rng, names, n, countries, split, world,
                     n_cities=max(2, round(n * city_ratio)), n_companies=max(2, round(n * company_ratio)))
    order = list(world.facts)
    rng.shuffle(order)  # passages of train and test entities interleaved in the corpus
    world.passages = [{"id": str(i), "contents": f"{e}\n{_passage_text(world, e)}"} for i, e in enumerate(order)]
    for split in ("train", "test"):
        qs: list[Question] = []
        for e in world.entities(split):
            kind = world.kinds[e]
            for rel, r in RELATIONS.items():
                if r.subject == kind:
                    qs.append(Question(r.question.format(x=e), world.answer(e, [rel]), e, [rel], split))
            if kind == "person":
                for chain, template in CHAINS.items():
                    if len(chain) <= max_hops:
                        qs.append(Question(template.format(x=e), world.answer(e, list(chain)), e, list(chain), split))
        rng.shuffle(qs)
        world.questions[split] = qs
    return world


@dataclass
class WorldFiles:
    corpus: Path
    train: Path
    test: Path


DATA_SOURCE = "rlfactory_world"


def question_rows(world: World, split: str) -> list[dict[str, Any]]:
    """The split's questions as Search-R1 parquet rows; `extra_info` keeps subject and relations
    (what the solver follows)."""
    return [
        qa_row(
            data_source=DATA_SOURCE, split=split, index=i, question=q.text, answers=[q.answer],
            prompt_text=searchr1_prompt(q.text), ability="fact-reasoning",
            extra={"subject": q.subject, "relations": q.relations, "hops": q.hops},
        )
        for i, q in enumerate(world.questions[split])
    ]


def write_world(world: World, out_dir: str | Path) -> WorldFiles:
    """Write corpus.jsonl ({"id", "contents"} per line) and train.parquet / test.parquet."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in world.passages), encoding="utf-8")
    train = write_parquet(question_rows(world, "train"), out / "train.parquet")
    test = write_parquet(question_rows(world, "test"), out / "test.parquet")
    return WorldFiles(corpus=corpus, train=train, test=test)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Write a knowledge world: corpus.jsonl, train.parquet, test.parquet")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-entities", type=int, default=200)
    ap.add_argument("--test-entities", type=int, default=50)
    ap.add_argument("--max-hops", type=int, default=2)
    a = ap.parse_args(argv)
    files = write_world(make_world(a.seed, a.train_entities, a.test_entities, max_hops=a.max_hops), a.out)
    print(f"corpus: {files.corpus}\ntrain: {files.train}\ntest: {files.test}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
