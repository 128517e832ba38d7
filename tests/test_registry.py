"""rlfactory.registry: one registry with one error style, and every registry of rlfactory built on it."""

from __future__ import annotations

import textwrap

import pytest

from rlfactory.config import ConfigError
from rlfactory.registry import Registry


def _module(tmp_path, monkeypatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_register_lookup_and_aliases():
    reg: Registry[object] = Registry("widget", "thing.widget")

    @reg.register("round", "circle")
    def round_widget() -> str:
        return "o"

    assert reg.lookup("round") is round_widget and reg.lookup("circle") is round_widget
    assert reg.resolve("circle") == "circle" and "round" in reg and len(reg) == 2
    assert reg.names() == ["circle", "round"] and dict(reg.items())["round"] is round_widget
    reg.add("round", round_widget)  # the same object again is fine (a module imported twice)
    with pytest.raises(ValueError, match="widget 'round' is already registered"):
        reg.add("round", lambda: "x")


def test_unknown_name_is_one_did_you_mean_line():
    reg: Registry[object] = Registry("widget", "thing.widget")
    reg.add("square", object())
    reg.add("round", object())
    with pytest.raises(ConfigError) as e:
        reg.lookup("sqare")
    assert str(e.value) == ("thing.widget: unknown widget 'sqare'; did you mean 'square'? "
                            "(known: round, square; or module:function)")
    with pytest.raises(ConfigError, match=r"^unknown widget 'zzz' \(known: none; or module:class\)$"):
        Registry("widget", kind="class").lookup("zzz")  # no key: a config validator adds it
    assert "\n" not in str(reg.unknown("q", ["a"], "; hint"))


def test_module_attr_is_imported_adopted_and_remembered(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "registry_test_plugin", """
        from tests_registry_shared import REG

        @REG.register("registered_there")
        def there(): return 1

        def plain(): return 2

        NOT_CALLABLE = 3
    """)
    shared = _module(tmp_path, monkeypatch, "tests_registry_shared", """
        from rlfactory.registry import Registry
        REG = Registry("widget", "thing.widget", adopt=lambda fn, name: (fn, name))
    """)
    reg = __import__(shared).REG
    assert reg.resolve(f"{mod}:registered_there") == "registered_there"  # the module registered it
    assert reg.resolve(f"{mod}:plain") == f"{mod}:plain"
    fn, name = reg[f"{mod}:plain"]
    assert fn() == 2 and name == f"{mod}:plain"
    with pytest.raises(ConfigError, match=r"^thing.widget: 'registry_test_plugin:NOT_CALLABLE' is not a function "
                                          r"\(it is of type int\)$"):
        reg.lookup(f"{mod}:NOT_CALLABLE")
    with pytest.raises(ConfigError, match=r"^thing.widget: 'registry_test_plugin' has no function 'plian'; "
                                          r"did you mean 'plain'\?"):
        reg.lookup(f"{mod}:plian")
    with pytest.raises(ConfigError, match=r"^thing.widget: no module named 'registry_test_plugn'; "
                                          r"did you mean 'registry_test_plugin'\?"):
        reg.lookup("registry_test_plugn:plain")


def test_builtins_are_imported_on_first_use_and_refs_can_be_left_unlisted(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "registry_test_lazy", """
        class Lazy: pass
        class Other: pass
    """)
    reg: Registry[type] = Registry("gadget", "thing.gadget", "class", lazy={"lazy": f"{mod}:Lazy"},
                                   remember_refs=False)
    assert "lazy" not in reg and reg.names() == ["lazy"]
    assert reg.lookup("lazy").__name__ == "Lazy" and "lazy" in reg
    assert reg.lookup(f"{mod}:Other").__name__ == "Other" and reg.names() == ["lazy"]


def test_every_registry_gives_the_did_you_mean_line():
    from rlfactory.algos import get_advantage, get_policy_loss
    from rlfactory.chat import make_tool_manager
    from rlfactory.envs import make_env
    from rlfactory.rewards.rule import get_term
    from rlfactory.rewards.turns import get_turn_term

    cases = [
        (lambda: get_advantage("rlooo"), "unknown advantage estimator 'rlooo'; did you mean 'rloo'? (known: "),
        (lambda: get_policy_loss("gspoo"), "unknown policy loss 'gspoo'; did you mean 'gspo'? (known: "),
        (lambda: get_term("exact_mach"), "unknown reward term 'exact_mach'; did you mean 'exact_match'? (known: "),
        (lambda: get_turn_term("tool_sucess"),
         "unknown turn term 'tool_sucess'; did you mean 'tool_success'? (known: "),
        (lambda: make_env("calculater"), "env.name: unknown env 'calculater'; did you mean 'calculator'? (known: "),
        (lambda: make_tool_manager(None, "qwen"),  # the family is looked up before the tokenizer is used
         "model.family: unknown ToolManager family 'qwen'; did you mean 'qwen3'? (known: "),
    ]
    for call, head in cases:
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value).startswith(head), str(e.value)
        assert "\n" not in str(e.value)
